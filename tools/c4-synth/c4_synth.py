"""c4-synth: collective schedules synthesized for a fabric as a traffic-engineering MILP (TE-CCL style).

Reads a C4P topology file (or generates a fabric), solves the AllGather over epochs with HiGHS
(one solve over the whole horizon, or consecutive rounds of a few epochs: time partitioning),
derives ReduceScatter (the AllGather reversed) and AllReduce (ReduceScatter then AllGather), or
solves an AllToAll as an LP (synth_a2a.py; switches cut through in every model), checks the result
and writes a schedule file (docs/schedules.md) that C4_SCHEDULE_FILE loads. See
docs/c4-synth.md for the formulation, the options and measured numbers.

Exit codes: 0 written (or --check passed); 1 --check found a bad schedule, or a synthesized
schedule failed the checks (a bug); 2 bad usage or input (options, topology file); 3 no schedule:
the solver found no feasible solution (time limit, infeasible --epochs, solver missing or failed):
the caller falls back to the generated algorithms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

import synth_a2a  # noqa: E402
import synth_check  # noqa: E402
import synth_core  # noqa: E402
import synth_schedule  # noqa: E402
import synth_topology  # noqa: E402

EXIT_OK = 0
EXIT_BAD_SCHEDULE = 1
EXIT_USAGE = 2
EXIT_NO_SCHEDULE = 3
DEFAULT_CHUNK_BYTES = 1 << 20
DEFAULT_TIME_LIMIT = 300.0
DEFAULT_MAX_COLUMNS = 12000  # larger full models switch to time partitioning (--round-epochs auto)
DEFAULT_ROUND_EPOCHS = 4
DEFAULT_LOOKAHEAD = 3.0
MIN_ROUND_SECONDS = 2.0
DEFAULT_ROUND_GAP = 0.01  # rounds are a heuristic: a 1% gap halves their time at 64 hosts, same result


class Fail(Exception):
    """Ends the run with a message and an exit code."""

    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


def log(args, msg):
    if not args.quiet:
        print(msg, flush=True)


def parse_rate(text):
    m = re.fullmatch(r"(.+)=([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)", text)
    if not m or float(m.group(2)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CABLE=GBPS (CABLE may be a glob pattern, GBPS > 0)")
    return (m.group(1), float(m.group(2)))


def positive_int(lo, hi):
    def f(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} out of range ({lo}-{hi})")
        return v
    return f


def nonneg_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{v} must be >= 0")
    return v


def positive_float(text):
    v = nonneg_float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} must be > 0")
    return v


def round_epochs(text):
    if text == "auto":
        return None
    return positive_int(0, 1 << 20)(text)


def build_parser():
    p = argparse.ArgumentParser(
        prog="c4-synth",
        description="Synthesizes an AllGather / ReduceScatter / AllReduce / AllToAll schedule file for a "
                    "fabric (traffic-engineering MILP or LP over epochs, solved with HiGHS). docs/c4-synth.md.",
        epilog="exit codes: 0 ok; 1 bad schedule (--check) or failed self-check; 2 bad usage/input; "
               "3 no schedule found (time limit, infeasible, solver missing): fall back to generated algorithms")
    src = p.add_argument_group("fabric")
    src.add_argument("--topo", metavar="FILE", help="C4P topology JSON (netlab's format, docs/netlab.md)")
    src.add_argument("--gen", metavar="SPEC", help="a generated fabric instead: " + synth_topology.GEN_HELP)
    src.add_argument("--ports", type=positive_int(1, 64), default=1,
                     help="--gen: cables per host to its switch, or per neighbor pair for line/ring (1)")
    src.add_argument("--rate", type=parse_rate, action="append", default=[], metavar="CABLE=GBPS",
                     help="set the rate of the cables matching a glob pattern, e.g. 'leaf*-spine*=400' "
                          "(repeatable, applied in order)")
    src.add_argument("--default-gbps", type=positive_float, default=None, metavar="G",
                     help="rate of links with rate_bps 0 (unshaped) and of generated ones (100; DGX-1: 200)")
    src.add_argument("--alpha", type=positive_int(0, 1000), default=0, metavar="EPOCHS",
                     help="latency per link hop in epochs, added to every link's transfer time (0)")
    coll = p.add_argument_group("collective")
    coll.add_argument("--coll", help="allgather, reducescatter, allreduce or alltoall")
    coll.add_argument("--chunks", type=positive_int(1, 1024), default=1, metavar="K",
                      help="chunks per block (the file's \"chunks\"; 1)")
    coll.add_argument("--chunk-bytes", type=positive_int(1, 1 << 40), default=DEFAULT_CHUNK_BYTES, metavar="B",
                      help="bytes per chunk for the predicted times and bandwidth (1 MiB)")
    coll.add_argument("--out", metavar="FILE", help="schedule file to write")
    coll.add_argument("--name", help="schedule name (file:NAME in logs; default from the collective and fabric)")
    sol = p.add_argument_group("solver")
    sol.add_argument("--solver", choices=("highs", "greedy"), default="highs",
                     help="highs: the MILP (default); greedy: the list scheduler only (no MILP)")
    sol.add_argument("--time-limit", type=nonneg_float, default=DEFAULT_TIME_LIMIT, metavar="S",
                     help="seconds for the whole synthesis, solves included (300)")
    sol.add_argument("--mip-gap", type=nonneg_float, default=None, metavar="G",
                     help="stop a solve at this relative MIP gap (default: when the makespan is proven "
                          f"optimal; rounds: {DEFAULT_ROUND_GAP:g})")
    sol.add_argument("--epochs", type=positive_int(1, 1 << 20), default=None, metavar="E",
                     help="horizon of the single solve (default: the greedy schedule's makespan)")
    sol.add_argument("--round-epochs", type=round_epochs, default=None, metavar="R",
                     help="time partitioning: solve rounds of R epochs; 0: one solve over the horizon; "
                          f"auto (default): 0 when the model has at most --max-columns columns, else "
                          f"{DEFAULT_ROUND_EPOCHS}")
    sol.add_argument("--max-columns", type=positive_int(1, 1 << 30), default=DEFAULT_MAX_COLUMNS, metavar="N",
                     help=f"size limit of a single solve for --round-epochs auto ({DEFAULT_MAX_COLUMNS})")
    sol.add_argument("--lookahead", type=nonneg_float, default=DEFAULT_LOOKAHEAD, metavar="W",
                     help="rounds: extra reward per epoch of distance a chunk covers to reach a host "
                          f"({DEFAULT_LOOKAHEAD:g})")
    sol.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                     help="do not give HiGHS the greedy schedule as a starting solution")
    sol.add_argument("--always-solve", action="store_true",
                     help="solve the MILP also when the greedy schedule already meets the lower bound "
                          "(by default that schedule is optimal and kept)")
    sol.add_argument("--seed", type=positive_int(0, 1 << 30), default=0, help="HiGHS random seed (0)")
    sol.add_argument("--extra-hops", type=positive_int(0, 16), default=1, metavar="H",
                     help="alltoall: routes of at most H links more than the fewest (relays through hosts "
                          "included) in the LP (1)")
    sol.add_argument("--write-mps", metavar="FILE",
                     help="write the single solve's model (with rounds: the first round's) as MPS, and "
                          "FILE.json with its objective weight, lower bound and horizon")
    sol.add_argument("--mps-only", action="store_true", help="stop after --write-mps")
    p.add_argument("--verbose", action="store_true", help="HiGHS's log")
    p.add_argument("--quiet", action="store_true", help="no report (errors only)")
    p.add_argument("--check", nargs="+", metavar="SCHEDULE",
                   help="check schedule files (structure, data, matching, deadlock, values) and exit")
    return p


def load_topology(args):
    try:
        if args.topo and args.gen:
            raise Fail(EXIT_USAGE, "--topo and --gen: give one")
        if args.topo:
            if args.ports != 1:
                raise Fail(EXIT_USAGE, "--ports applies to --gen only (a topology file lists its ports)")
            topo = synth_topology.load_file(args.topo, args.default_gbps)
        elif args.gen:
            topo = synth_topology.generate(args.gen, args.ports, args.default_gbps)
        else:
            raise Fail(EXIT_USAGE, "no fabric: give --topo FILE or --gen SPEC")
        topo.set_rates(args.rate)
        topo.set_epochs(args.alpha)
    except synth_topology.TopologyError as e:
        raise Fail(EXIT_USAGE, str(e)) from None
    return topo


def default_name(args, topo):
    short = {"allgather": "ag", "reducescatter": "rs", "allreduce": "ar", "alltoall": "a2a"}[args.coll]
    if args.topo:
        base = os.path.splitext(os.path.basename(args.topo))[0]
    else:
        base = args.gen.replace(":", "").replace(",", ".")
    name = re.sub(r"[^A-Za-z0-9_.+-]", "-", f"{short}-{base}-k{args.chunks}")
    return name[:48]


def fmt_bytes(b):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size and b % (size // 1024 if size > 1024 else 1) == 0:
            return f"{b / size:g} {unit}"
    return f"{b} B"


def fmt_time(s):
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def import_milp():
    try:
        import synth_milp
    except ImportError as e:
        raise Fail(EXIT_NO_SCHEDULE, f"the MILP solver is not available ({e}): run scripts/synth-venv.sh and use "
                                     f"tools/c4-synth/c4-synth (it runs .venv-synth/bin/python), or --solver greedy")
    if synth_milp.highspy is None:
        raise Fail(EXIT_NO_SCHEDULE, "highspy is not installed: run scripts/synth-venv.sh and use "
                                     "tools/c4-synth/c4-synth (it runs .venv-synth/bin/python), or --solver greedy")
    return synth_milp


def highs_version():
    try:
        from importlib.metadata import version
        return f"highs {version('highspy')}"
    except Exception:  # noqa: BLE001 (metadata missing: a source install)
        return "highs"


def write_mps(milp, model, path):
    milp.write_mps(model, path)
    with open(path + ".json", "w") as f:
        json.dump({"weight": model.weight, "lower_bound": model.lb, "horizon": model.horizon, "smax": model.smax,
                   "full": model.full, "columns": model.ncols, "rows": len(model.rows)}, f)
        f.write("\n")


def solve_full(args, topo, paths, lb, greedy_state, t_begin, report):
    """One solve over the whole horizon: minimal makespan, then early arrivals."""
    milp = import_milp()
    E = args.epochs if args.epochs is not None else greedy_state.makespan()
    if E < lb:
        raise Fail(EXIT_NO_SCHEDULE, f"--epochs {E} is below the lower bound of {lb} epochs: no schedule")
    state = synth_core.State(topo, args.chunks)
    tb = time.monotonic()
    try:
        model = milp.build(topo, state, 0, E, E, True, lb)
    except milp.Infeasible as e:
        raise Fail(EXIT_NO_SCHEDULE, f"no schedule within {E} epochs: {e}") from None
    log(args, f"  model: horizon {E} epochs, {model.stats()} ({time.monotonic() - tb:.1f} s to build)")
    if args.write_mps:
        write_mps(milp, model, args.write_mps)
        log(args, f"  wrote {args.write_mps} (+ .json)")
        if args.mps_only:
            return None
    start = None
    if args.warm_start and E >= greedy_state.makespan():
        start = milp.start_values(model, topo, state, greedy_state.transfers)
    left = args.time_limit - (time.monotonic() - t_begin)
    if left <= 0:
        raise Fail(EXIT_NO_SCHEDULE, f"time limit of {args.time_limit:g} s reached before the solve: no schedule")
    res = milp.solve(model, topo, state, left, args.mip_gap, start, args.verbose,
                     None if args.quiet else (lambda s: log(args, s)), args.seed)
    report.update(status=res.status, solve_s=res.seconds, gap=res.gap, mode="single solve", horizon=E)
    if not res.ok:
        raise Fail(EXIT_NO_SCHEDULE, f"HiGHS found no schedule within {E} epochs ({res.status}, "
                                     f"{res.seconds:.1f} s): fall back to the generated algorithms")
    # The makespan is proven optimal when the dual bound excludes every shorter one (HiGHS's
    # "Optimal" alone does not say it when --mip-gap allowed an earlier stop).
    proven_low = lb
    if math.isfinite(res.bound):
        proven_low = max(lb, lb + math.ceil((res.bound - model.smax) / model.weight - 1e-9))
    proven = proven_low >= res.makespan
    report.update(proven=proven)
    log(args, f"  HiGHS: {res.status}, {res.seconds:.2f} s, makespan {res.makespan} epochs"
              f"{' (proven optimal)' if proven else ''}, MIP gap {res.gap:.3g}")
    st = synth_core.State(topo, args.chunks)
    for tr in res.transfers:
        st.book(tr)
    return st


def solve_rounds(args, topo, paths, R, greedy_state, t_begin, report):
    """Time partitioning: rounds of R epochs (hosts start transfers inside the round; paths started
    there are completed through switches), each warm-started with the greedy plan of the round."""
    milp = import_milp()
    state = synth_core.State(topo, args.chunks)
    dsw = max((x[0] for p in paths for x in p), default=1)
    t0 = 0
    est_rounds = max(1, math.ceil(greedy_state.makespan() / R))
    solve_s = 0.0
    statuses = {}
    rnd = 0
    rest_greedy = False
    while state.missing():
        rnd += 1
        t1 = t0 + R
        left = args.time_limit - (time.monotonic() - t_begin)
        rounds_left = max(1, est_rounds - rnd + 1)
        if left < 0.5 or (left / rounds_left < 0.05 and rnd > 1):
            log(args, f"  time limit reached before round {rnd}: the rest by the greedy scheduler")
            synth_core.greedy(state, paths, t0)
            rest_greedy = True
            break
        tb = time.monotonic()
        model = milp.build(topo, state, t0, t1, t1 - 1 + dsw, False, lookahead=args.lookahead)
        if rnd == 1 and args.write_mps:
            write_mps(milp, model, args.write_mps)
            log(args, f"  wrote {args.write_mps} (+ .json): round 1, {model.stats()}")
            if args.mps_only:
                return None
        plan_state = state.copy()
        plan = synth_core.greedy(plan_state, paths, t0, t1)
        start = milp.start_values(model, topo, state, plan) if args.warm_start else None
        limit = max(min(left, MIN_ROUND_SECONDS), left / rounds_left)
        gap = args.mip_gap if args.mip_gap is not None else DEFAULT_ROUND_GAP
        res = milp.solve(model, topo, state, min(limit, left), gap, start, args.verbose, None, args.seed)
        solve_s += res.seconds
        statuses[res.status] = statuses.get(res.status, 0) + 1
        chosen = res.transfers if res.ok else plan
        for tr in chosen:
            state.book(tr)
        log(args, f"  round {rnd} (~{est_rounds}): epochs {t0}-{t1 - 1}: {len(chosen)} transfers "
                  f"(greedy {len(plan)}), {model.ncols} columns, {res.seconds:.1f} s {res.status}"
                  f"{'' if res.ok else ' (greedy plan kept)'}; {state.missing()} (rank, chunk) pairs left "
                  f"[{time.monotonic() - t_begin:.0f} s]")
        t0 = t1
        if rnd > 4 * est_rounds + 64:
            raise Fail(EXIT_NO_SCHEDULE, "time partitioning makes no progress: no schedule")
    report.update(status=", ".join(f"{k} x{v}" for k, v in sorted(statuses.items())) or "none",
                  solve_s=solve_s, mode=f"time partitioning, {R} epochs/round", rounds=rnd,
                  rest_greedy=rest_greedy)
    log(args, f"  HiGHS: {rnd} rounds, {solve_s:.1f} s solving, makespan {state.makespan()} epochs")
    return state


def run_synthesis(args):
    """Validates the options, reads the fabric and schedules the AllGather. Returns (topology, state
    with the transfers, lower bound, report) or None after --mps-only. Raises Fail."""
    t_begin = time.monotonic()
    if args.coll not in synth_schedule.COLLECTIVES:
        raise Fail(EXIT_USAGE, f"--coll {args.coll!r}: one of {', '.join(synth_schedule.COLLECTIVES)}")
    if not args.out and not args.mps_only:
        raise Fail(EXIT_USAGE, "--out FILE is required")
    if args.mps_only and not args.write_mps:
        raise Fail(EXIT_USAGE, "--mps-only needs --write-mps FILE")
    if args.name is not None and not synth_schedule.NAME_RE.fullmatch(args.name):
        raise Fail(EXIT_USAGE, f"--name {args.name!r}: 1-48 of [A-Za-z0-9_.+-]")
    topo = load_topology(args)
    n, K = topo.nranks, args.chunks
    if n * K > 1 << 16:
        raise Fail(EXIT_USAGE, f"{n} ranks x {K} chunks: at most 65536 chunks")
    tau = topo.tau(args.chunk_bytes)
    log(args, f"c4-synth: {topo.describe()}")
    log(args, f"  {args.coll}, {n} ranks x {K} chunk(s) of {fmt_bytes(args.chunk_bytes)}; epoch = "
              f"{fmt_time(tau)} (a chunk at {topo.rate_max / 1e9:g} Gbit/s)")
    paths = topo.host_paths()
    bound = (synth_core.lower_bound(topo, K) if n > 1 else
             {"epochs": 0, "ingress": 0, "egress": 0, "diameter": 0, "cut": 0})
    lb = bound["epochs"]
    greedy_state = synth_core.State(topo, K)
    synth_core.greedy(greedy_state, paths)
    log(args, f"  lower bound {lb} epochs (ingress {bound['ingress']}, egress {bound['egress']}, diameter "
              f"{bound['diameter']}, cut {bound['cut']}); greedy schedule {greedy_state.makespan()} epochs")
    report = {}
    if args.write_mps and (args.solver == "greedy" or n == 1):
        raise Fail(EXIT_USAGE, "--write-mps needs --solver highs and 2 or more ranks")
    meets = greedy_state.makespan() <= lb and args.epochs is None
    if args.solver == "greedy" or n == 1 or (meets and not args.always_solve and not args.write_mps):
        if args.solver == "highs" and n > 1:
            log(args, "  the greedy schedule meets the lower bound: it is optimal, no MILP to solve")
        state = greedy_state
        report.update(status="greedy", solve_s=0.0, mode="greedy", method="greedy")
        if meets:
            report.update(proven=True)
    else:
        R = args.round_epochs
        if R is None:
            est = len(topo.links) * n * K * max(1, greedy_state.makespan())
            R = 0 if est <= args.max_columns else DEFAULT_ROUND_EPOCHS
            log(args, f"  --round-epochs auto: {'one solve' if R == 0 else f'rounds of {R} epochs'} "
                      f"(~{est} link-chunk-epoch columns, --max-columns {args.max_columns})")
        if R and args.epochs is not None:
            raise Fail(EXIT_USAGE, "--epochs applies to a single solve (--round-epochs 0)")
        if R == 0:
            state = solve_full(args, topo, paths, lb, greedy_state, t_begin, report)
        else:
            state = solve_rounds(args, topo, paths, R, greedy_state, t_begin, report)
            if state is not None and state.makespan() > greedy_state.makespan():
                log(args, f"  the greedy schedule is shorter ({greedy_state.makespan()} epochs): kept instead")
                state = greedy_state
                report.update(mode=report["mode"] + ", greedy kept (shorter)", method="greedy")
        if state is not None and state.makespan() <= lb:
            report.update(proven=True)
    report["t_begin"] = t_begin
    return None if state is None else (topo, state, lb, report)


def synthesize(args):
    """Synthesizes, checks and writes the schedule file; returns the exit code."""
    got = run_synthesis(args)
    if got is None:  # --mps-only
        return EXIT_OK
    topo, state, lb, report = got
    t_begin = report["t_begin"]
    n, K = topo.nranks, args.chunks
    tau = topo.tau(args.chunk_bytes)
    E = state.makespan()
    transfers = sorted(state.transfers, key=lambda t: t.key())
    # Self-check in the model (cut-through paths and timing, link capacity, holding, receive once) by
    # booking into a fresh state; the reversed transfers (ReduceScatter) are replayed for paths and
    # capacity too.
    chk = synth_core.State(topo, K)
    try:
        for tr in sorted(transfers, key=lambda t: (t.start, t.arrive)):
            chk.book(tr)
        if args.coll != "allgather":
            cap = synth_core.Links(topo)
            for tr in synth_schedule.reverse(transfers, E, topo):
                synth_core.check_transfer(topo, tr)
                cap.take(tr)
    except AssertionError as e:
        raise Fail(EXIT_BAD_SCHEDULE, f"internal error: the solution breaks the model: {e}") from None
    if chk.missing():
        raise Fail(EXIT_BAD_SCHEDULE, f"internal error: {chk.missing()} (rank, chunk) pairs are never delivered")
    phases = {"allgather": 1, "reducescatter": 1, "allreduce": 2}[args.coll]
    epochs = phases * E
    total_bytes = n * K * args.chunk_bytes
    t_pred = epochs * tau
    algbw = total_bytes / t_pred / 1e9 if t_pred > 0 else 0.0  # one rank: nothing moves
    busbw = algbw * (n - 1) / n * (2 if args.coll == "allreduce" else 1)
    lbp = phases * lb
    above = (epochs - lbp) / lbp * 100 if lbp else 0.0
    info = {
        "tool": "c4-synth",
        "method": report.get("method", "milp"),
        "solver": "greedy" if report.get("mode") == "greedy" else highs_version(),
        "solver_status": report.get("status"),
        "solver_time_s": round(report.get("solve_s", 0.0), 3),
        "mode": report.get("mode"),
        "epochs": epochs,
        "allgather_epochs": E,
        "lower_bound_epochs": lbp,
        "tau_s": tau,
        "chunk_bytes": args.chunk_bytes,
        "predicted_time_s": t_pred,
        "algbw_GBps": round(algbw, 4),
        "busbw_GBps": round(busbw, 4),
        "topology_source": topo.source,
        "transfers": len(transfers),
    }
    if "gap" in report and report["gap"] == report["gap"]:
        info["mip_gap"] = report["gap"]
    if "proven" in report:
        info["makespan_proven_optimal"] = bool(report["proven"])
    if report.get("rest_greedy"):
        info["rest_by_greedy"] = True
    st = write_schedule(args, topo, args.coll, n, K, transfers, E, info, topo)
    log(args, f"  schedule: {epochs} epochs = {fmt_time(t_pred)} predicted for {fmt_bytes(total_bytes)}, "
              f"algbw {algbw:.3g} GB/s (busbw {busbw:.3g}); lower bound {lbp} epochs "
              f"({above:.1f}% above); solver {report.get('solve_s', 0.0):.2f} s ({report.get('mode')})")
    log(args, f"  wrote {args.out}: {args.coll}, {st['messages']} messages, depth {st['depth']} (checked), "
              f"{time.monotonic() - t_begin:.1f} s in all")
    return EXIT_OK


def write_schedule(args, topo, coll, n, K, transfers, E, info, replay_topo=None):
    """The schedule file of `transfers` (with the fabric's topology hash and hosts when it came from a
    file), checked by synth_check before it is written to args.out; returns the checker's statistics.
    `replay_topo`: the fabric schedule_doc reverses the AllGather's transfers on (ReduceScatter,
    AllReduce)."""
    topology = None
    if topo.file_hash is not None:
        topology = {"hash": f"0x{topo.file_hash:016x}", "hosts": topo.host_names()}
    name = args.name or default_name(args, topo)
    doc = synth_schedule.schedule_doc(name, coll, n, K, transfers, E, topology, info, replay_topo)
    text = synth_schedule.dumps(doc)
    try:
        st = synth_check.check(json.loads(text), args.out)
    except synth_check.ScheduleError as e:
        raise Fail(EXIT_BAD_SCHEDULE, f"internal error: the synthesized schedule fails the checks: {e}") from None
    write_text(args, text)
    return st


def run_alltoall(args):
    """Validates the options, reads the fabric and schedules the AllToAll (docs/c4-synth.md,
    "AllToAll"). Returns (topology, transfers, lower bound dict, report) or None after --mps-only."""
    t_begin = time.monotonic()
    if not args.out and not args.mps_only:
        raise Fail(EXIT_USAGE, "--out FILE is required")
    if args.mps_only and not args.write_mps:
        raise Fail(EXIT_USAGE, "--mps-only needs --write-mps FILE")
    if args.name is not None and not synth_schedule.NAME_RE.fullmatch(args.name):
        raise Fail(EXIT_USAGE, f"--name {args.name!r}: 1-48 of [A-Za-z0-9_.+-]")
    if args.round_epochs:
        raise Fail(EXIT_USAGE, "--round-epochs applies to allgather, reducescatter and allreduce")
    topo = load_topology(args)
    n, K = topo.nranks, args.chunks
    if n * n * K > 1 << 20:
        raise Fail(EXIT_USAGE, f"{n} ranks: {n} x {n} blocks x {K} chunks: at most 2^20 chunks")
    tau = topo.tau(args.chunk_bytes)
    log(args, f"c4-synth: {topo.describe()}")
    log(args, f"  alltoall, {n} ranks, {n} x {n} blocks x {K} chunk(s) of {fmt_bytes(args.chunk_bytes)}; epoch = "
              f"{fmt_time(tau)} (a chunk at {topo.rate_max / 1e9:g} Gbit/s)")
    report = {"t_begin": t_begin}
    if n == 1:
        report.update(status="nothing to send", solve_s=0.0, mode="direct", method="direct", proven=True)
        return topo, [], {"epochs": 0}, report
    bound = synth_a2a.lower_bound(topo, K)
    lb = bound["epochs"]
    direct = synth_a2a.direct_schedule(topo, K)
    ub = synth_a2a.makespan(direct)
    log(args, f"  lower bound {lb} epochs (egress {bound['egress']}, ingress {bound['ingress']}, cut {bound['cut']}, "
              f"volume {bound['volume']}, latency {bound['latency']}); direct schedule {ub} epochs")
    if args.write_mps and args.solver == "greedy":
        raise Fail(EXIT_USAGE, "--write-mps needs --solver highs")
    if args.solver == "greedy" or (ub <= lb and args.epochs is None and not args.always_solve and not args.write_mps):
        if args.solver == "highs":
            log(args, "  the direct schedule meets the lower bound: it is optimal, no LP to solve")
        report.update(status="direct", solve_s=0.0, mode="direct", method="direct", lp_epochs=None)
        if ub <= lb:
            report.update(proven=True)
        return topo, direct, bound, report
    milp = import_milp()
    if args.epochs is not None and args.epochs < lb:
        raise Fail(EXIT_NO_SCHEDULE, f"--epochs {args.epochs} is below the lower bound of {lb} epochs: no schedule")
    # The smallest horizon whose LP is feasible: binary search in [lb, ub] (feasible at ub: the direct
    # schedule is an LP solution), or --epochs alone.
    lo, hi = (args.epochs, args.epochs) if args.epochs is not None else (lb, ub)
    best = None  # (T, lp, x)
    solve_s = 0.0
    solves = []
    while lo <= hi:
        T = (lo + hi) // 2
        left = args.time_limit - (time.monotonic() - t_begin)
        if left <= 0:
            log(args, "  time limit reached")
            break
        tb = time.monotonic()
        try:
            lp = synth_a2a.LP(topo, K, T, args.extra_hops)
        except synth_a2a.Infeasible as e:
            log(args, f"  horizon {T}: infeasible by construction ({e})")
            lo = T + 1
            continue
        build_s = time.monotonic() - tb
        if args.write_mps and not solves:
            write_mps(milp, lp.model, args.write_mps)
            log(args, f"  wrote {args.write_mps} (+ .json): horizon {T}, {lp.model.stats()}")
            if args.mps_only:
                return None
        left = args.time_limit - (time.monotonic() - t_begin)
        status, ok, secs, x = lp.solve(left, args.verbose, args.seed)
        solve_s += secs
        solves.append((T, status))
        log(args, f"  LP horizon {T}: {status}, {secs:.2f} s ({lp.model.stats()}, {build_s:.1f} s to build)"
                  f" [{time.monotonic() - t_begin:.0f} s]")
        if ok:
            best = (T, lp, x)
            hi = T - 1
        elif status == "Infeasible":
            lo = T + 1
        else:  # time limit or a solver failure: no answer for this horizon
            break
    report.update(solve_s=solve_s, status=", ".join(f"T={T} {st}" for T, st in solves) or "none")
    if best is None:
        raise Fail(EXIT_NO_SCHEDULE, f"HiGHS found no AllToAll LP solution "
                                     f"({report['status']}, {solve_s:.1f} s): fall back to the generated algorithms")
    T, lp, x = best
    proven_lp = T == lo or T == lb  # every shorter horizon was proven infeasible (or T is the bound)
    items = synth_a2a.lp_items(topo, K, lp, x)
    transfers, order = synth_a2a.best_schedule(topo, K, items)
    E = synth_a2a.makespan(transfers)
    log(args, f"  LP makespan {T} epochs{' (smallest feasible)' if proven_lp else ''}; whole chunks "
              f"list-scheduled on the LP's routes: {E} epochs (order {order})")
    report.update(mode="LP", method="lp", lp_epochs=T, lp_min_proven=proven_lp)
    if E > ub:
        log(args, f"  the direct schedule is shorter ({ub} epochs): kept instead")
        transfers = direct
        report.update(mode="LP, direct kept (shorter)", method="direct")
    if synth_a2a.makespan(transfers) <= lb:
        report.update(proven=True)
    return topo, transfers, bound, report


def synthesize_alltoall(args):
    """Synthesizes, checks and writes an AllToAll schedule file; returns the exit code."""
    got = run_alltoall(args)
    if got is None:
        return EXIT_OK
    topo, transfers, bound, report = got
    t_begin = report["t_begin"]
    n, K = topo.nranks, args.chunks
    tau = topo.tau(args.chunk_bytes)
    try:
        synth_a2a.check_alltoall(topo, K, transfers)
    except AssertionError as e:
        raise Fail(EXIT_BAD_SCHEDULE, f"internal error: the AllToAll breaks the model: {e}") from None
    E = synth_a2a.makespan(transfers)
    lb = bound["epochs"]
    t_pred = E * tau
    per_rank = n * K * args.chunk_bytes  # nccl-tests: algbw = bytes each rank sends (n x count) / time
    algbw = per_rank / t_pred / 1e9 if t_pred > 0 else 0.0
    busbw = algbw * (n - 1) / n
    above = (E - lb) / lb * 100 if lb else 0.0
    info = {
        "tool": "c4-synth",
        "method": report.get("method"),
        "solver": "direct" if report.get("method") == "direct" and not report.get("lp_epochs") else highs_version(),
        "solver_status": report.get("status"),
        "solver_time_s": round(report.get("solve_s", 0.0), 3),
        "mode": report.get("mode"),
        "epochs": E,
        "lp_epochs": report.get("lp_epochs"),
        "lower_bound_epochs": lb,
        "lower_bounds": {k: v for k, v in bound.items() if k != "epochs"},
        "tau_s": tau,
        "chunk_bytes": args.chunk_bytes,
        "predicted_time_s": t_pred,
        "algbw_GBps": round(algbw, 4),
        "busbw_GBps": round(busbw, 4),
        "topology_source": topo.source,
        "transfers": len(transfers),
        "relayed": sum(1 for tr in transfers if (tr.chunk // K) % n != tr.dst),
    }
    if "proven" in report:
        info["makespan_proven_optimal"] = bool(report["proven"])
    st = write_schedule(args, topo, "alltoall", n, K, sorted(transfers, key=lambda t: t.key()), E, info)
    log(args, f"  schedule: {E} epochs = {fmt_time(t_pred)} predicted for {fmt_bytes(per_rank)} per rank, "
              f"algbw {algbw:.3g} GB/s (busbw {busbw:.3g}); lower bound {lb} epochs ({above:.1f}% above); "
              f"solver {report.get('solve_s', 0.0):.2f} s ({report.get('mode')})")
    log(args, f"  wrote {args.out}: alltoall, {st['messages']} messages ({info['relayed']} relayed), depth "
              f"{st['depth']} (checked), {time.monotonic() - t_begin:.1f} s in all")
    return EXIT_OK


def write_text(args, text):
    try:
        if os.path.exists(args.out) and not os.path.isfile(args.out):
            with open(args.out, "w") as f:  # /dev/stdout, a pipe: never rename over those
                f.write(text)
        else:
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, args.out)  # readers never see a partial file
    except OSError as e:
        raise Fail(EXIT_USAGE, f"cannot write {args.out}: {e.strerror}") from None


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.check:
            rc = EXIT_OK
            for path in args.check:
                try:
                    st = synth_check.check_file(path)
                    log(args, f"{path}: ok ({st['steps']} steps, {st['messages']} messages, depth {st['depth']})")
                except synth_check.ScheduleError as e:
                    print(f"c4-synth: FAIL {e}", file=sys.stderr)
                    rc = EXIT_BAD_SCHEDULE
            return rc
        if args.coll is None:
            parser.print_usage(sys.stderr)
            raise Fail(EXIT_USAGE, "--coll is required (allgather, reducescatter, allreduce or alltoall)")
        if args.coll == "alltoall":
            return synthesize_alltoall(args)
        return synthesize(args)
    except Fail as e:
        print(f"c4-synth: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("c4-synth: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
