#!/usr/bin/env python3
"""c4-synth measurements (docs/c4-synth.md, "Measured").

  synth_bench.py solvers [--time-limit S] [--out DIR] [--only NAME,...]
      Writes the AllGather MILP of each instance as MPS (c4-synth --write-mps --mps-only) and solves
      the same file with HiGHS (highspy), COIN-OR CBC (cbc) and GLPK (glpsol), one thread each, relative
      MIP gap 1e-4, under a time limit; then HiGHS and CBC again with c4-synth's own stopping rule
      (absolute gap = the largest arrival-time sum: stop once the makespan is proven).
  synth_bench.py quality [--time-limit S] [--out DIR] [--only NAME,...]
      Runs c4-synth (AllGather, HiGHS) on DGX-1 and 2-tier leaf-spine fabrics of 8-64 hosts and
      reports solver time, epochs, predicted time and the gap to the lower bound.
  synth_bench.py alltoall [--time-limit S] [--out DIR] [--only NAME,...]
      Runs c4-synth --coll alltoall (the LP, whole chunks list-scheduled) on DGX-1 and 8-32 host
      leaf-spines, and the direct schedule (--solver greedy), against the lower bound.
Prints a markdown table and writes DIR/*.json (default bench-results/synth).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "c4-synth", "c4_synth.py")
REL_GAP = 1e-4

# name, c4-synth fabric/model options. "round1": the first round's model of time partitioning.
SOLVER_INSTANCES = [
    ("dgx1-k1", ["--gen", "dgx1", "--chunks", "1", "--round-epochs", "0"]),
    ("dgx1-k4", ["--gen", "dgx1", "--chunks", "4", "--round-epochs", "0"]),
    ("dgx1-k8", ["--gen", "dgx1", "--chunks", "8", "--round-epochs", "0"]),
    ("ls8-k1", ["--gen", "leafspine:8,2,2", "--chunks", "1", "--round-epochs", "0"]),
    ("ls8-k2", ["--gen", "leafspine:8,2,2", "--chunks", "2", "--round-epochs", "0"]),
    ("ls16-k1", ["--gen", "leafspine:16,4,2", "--chunks", "1", "--round-epochs", "0"]),
    ("ls32-k1", ["--gen", "leafspine:32,4,4", "--chunks", "1", "--round-epochs", "0"]),
    ("ls16-k1-round1", ["--gen", "leafspine:16,4,2", "--chunks", "1", "--round-epochs", "4"]),
    ("ls32-k1-round1", ["--gen", "leafspine:32,4,4", "--chunks", "1", "--round-epochs", "4"]),
]

QUALITY_INSTANCES = [
    ("dgx1-k1", ["--gen", "dgx1", "--chunks", "1"]),
    ("dgx1-k4", ["--gen", "dgx1", "--chunks", "4"]),
    ("dgx1-k8", ["--gen", "dgx1", "--chunks", "8"]),
    ("dgx1-k8-single", ["--gen", "dgx1", "--chunks", "8", "--round-epochs", "0", "--always-solve"]),
    ("ls8-k1", ["--gen", "leafspine:8,2,2"]),
    ("ls8-k4-fastup", ["--gen", "leafspine:8,2,2,100,400", "--chunks", "4"]),
    ("ls16-k1", ["--gen", "leafspine:16,4,2"]),
    ("ls16-k1-fastup", ["--gen", "leafspine:16,4,2,100,400"]),
    ("ls32-k1", ["--gen", "leafspine:32,4,4"]),
    ("ls64-k1", ["--gen", "leafspine:64,8,4"]),
    ("ls64-k1-fastup", ["--gen", "leafspine:64,8,4,100,400"]),
]


A2A_INSTANCES = [
    ("dgx1-k1", ["--gen", "dgx1", "--chunks", "1"]),
    ("dgx1-k4", ["--gen", "dgx1", "--chunks", "4"]),
    ("ls8-k1", ["--gen", "leafspine:8,2,2"]),
    ("ls8-k4", ["--gen", "leafspine:8,2,2", "--chunks", "4"]),
    ("ls16-k1", ["--gen", "leafspine:16,4,2"]),
    ("ls32-k1", ["--gen", "leafspine:32,4,4"]),
    ("ls8-k1-slowup", ["--gen", "leafspine:8,2,2,100,25"]),
]


def python():
    venv = os.path.join(ROOT, ".venv-synth", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def write_mps(name, opts, outdir):
    mps = os.path.join(outdir, f"{name}.mps")
    cmd = [python(), TOOL, "--coll", "allgather", *opts, "--write-mps", mps, "--mps-only", "--quiet"]
    subprocess.run(cmd, check=True)
    with open(mps + ".json") as f:
        return mps, json.load(f), cmd


def makespan_of(meta, obj):
    if not meta["full"] or obj is None or not math.isfinite(obj):
        return None
    return meta["lower_bound"] + int(obj // meta["weight"])


def proven_of(meta, bound):
    """The makespan lower bound a dual bound proves."""
    if not meta["full"] or bound is None or not math.isfinite(bound):
        return None
    return meta["lower_bound"] + max(0, math.ceil((bound - meta["smax"]) / meta["weight"] - 1e-9))


def run_killable(cmd, limit):
    """subprocess.run with a hard timeout of 3x the solver's limit + 2 min (a solver that ignores its
    limit, e.g. while presolving a large model on a busy machine, is killed): (process or None, seconds)."""
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit * 3 + 120)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - t
    return p, time.monotonic() - t


def killed(dt):
    return {"status": f"killed after {dt:.0f} s (ignored its time limit)", "seconds": dt, "objective": None,
            "bound": None, "optimal": False}


def run_highs(mps, limit, abs_gap=None):
    code = f"""
import json, sys, time, highspy
h = highspy.Highs()
h.setOptionValue("output_flag", False)
h.readModel({mps!r})
h.setOptionValue("time_limit", {float(limit)!r})
h.setOptionValue("threads", 1)
h.setOptionValue("mip_rel_gap", {REL_GAP!r})
if {abs_gap!r} is not None:
    h.setOptionValue("mip_abs_gap", float({abs_gap!r}))
t = time.monotonic()
h.run()
dt = time.monotonic() - t
i = h.getInfo()
has = i.primal_solution_status == 2
print(json.dumps({{"status": h.modelStatusToString(h.getModelStatus()), "seconds": dt,
                  "objective": i.objective_function_value if has else None,
                  "bound": i.mip_dual_bound}}))
"""
    p, dt = run_killable([python(), "-c", code], limit)
    if p is None:
        return killed(dt)
    if p.returncode != 0:
        return {"status": f"error: {p.stderr.strip()[-200:]}", "seconds": None, "objective": None, "bound": None}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["optimal"] = r["status"] == "Optimal"
    return r


def run_cbc(mps, limit, abs_gap=None):
    cmd = ["cbc", mps, "-sec", str(limit), "-threads", "1", "-ratioGap", str(REL_GAP)]
    if abs_gap is not None:
        cmd += ["-allowableGap", str(abs_gap)]
    cmd += ["-solve", "-quit"]
    p, dt = run_killable(cmd, limit)
    if p is None:
        return killed(dt)
    out = p.stdout
    m = re.search(r"Result - (.*)", out)
    status = m.group(1).strip() if m else f"exit {p.returncode}"
    obj = re.search(r"Objective value:\s+(\S+)", out)
    lb = re.search(r"Lower bound:\s+(\S+)", out)
    objective = float(obj.group(1)) if obj and "No feasible" not in status and "infeasible" not in status else None
    if objective is not None and objective > 1e49:
        objective = None
    bound = float(lb.group(1)) if lb else (objective if status.startswith("Optimal") else None)
    return {"status": status, "seconds": dt, "objective": objective, "bound": bound,
            "optimal": status.startswith("Optimal")}


def run_glpk(mps, limit):
    # The solution report goes to a file of its own: glpsol unlinks its -o file (never /dev/null).
    cmd = ["glpsol", "--mps", mps, "--tmlim", str(int(math.ceil(limit))), "--mipgap", str(REL_GAP),
           "-o", mps + ".glpk.txt"]
    p, dt = run_killable(cmd, limit)
    if p is None:
        return killed(dt)
    out = p.stdout
    status = "?"
    for key in ("INTEGER OPTIMAL SOLUTION FOUND", "TIME LIMIT EXCEEDED", "PROBLEM HAS NO INTEGER FEASIBLE SOLUTION",
                "PROBLEM HAS NO PRIMAL FEASIBLE SOLUTION"):
        if key in out:
            status = key.lower()
    objective = bound = None
    for line in out.splitlines():
        m = re.match(r"\+\s*\d+: mip =\s+(not found yet|\S+)\s+>=\s+(\S+)", line)
        if m:
            objective = None if m.group(1) == "not found yet" else float(m.group(1))
            try:
                bound = float(m.group(2))
            except ValueError:
                bound = None
    optimal = status.startswith("integer optimal")
    if optimal and bound is None:  # "mip = X >= tree is empty"
        bound = objective
    return {"status": status, "seconds": dt, "objective": objective, "bound": bound, "optimal": optimal}


def gap(r):
    o, b = r.get("objective"), r.get("bound")
    if o is None or b is None or not math.isfinite(b):
        return None
    return abs(o - b) / max(1e-9, abs(o))


def cell(r, meta):
    if r.get("optimal") and r.get("bound") is None:
        r = dict(r, bound=r.get("objective"))
    if r.get("seconds") is None:
        return r["status"]
    g = gap(r)
    ms, pv = makespan_of(meta, r.get("objective")), proven_of(meta, r.get("bound"))
    if r["optimal"]:
        txt = f"**{r['seconds']:.1f} s** opt"
    elif r.get("objective") is None:
        txt = f"no solution in {r['seconds']:.0f} s"
    else:
        txt = f"limit {r['seconds']:.0f} s, gap {100 * g:.1f}%" if g is not None else f"limit {r['seconds']:.0f} s"
    if meta["full"]:
        if ms is not None:
            txt += f", E={ms}"
        if pv is not None:
            txt += f" (>={pv})"
    return txt


def solvers(args):
    os.makedirs(args.out, exist_ok=True)
    have = {s: shutil.which(s) is not None for s in ("cbc", "glpsol")}
    rows = []
    for name, opts in SOLVER_INSTANCES:
        if args.only and name not in args.only:
            continue
        mps, meta, cmd = write_mps(name, opts, args.out)
        print(f"[{name}] {meta['columns']} columns, {meta['rows']} rows; {' '.join(cmd[2:])}", file=sys.stderr,
              flush=True)
        res = {"highs": run_highs(mps, args.time_limit)}
        res["cbc"] = run_cbc(mps, args.time_limit) if have["cbc"] else {"status": "cbc missing", "seconds": None}
        res["glpk"] = run_glpk(mps, args.time_limit) if have["glpsol"] else {"status": "glpsol missing",
                                                                             "seconds": None}
        if meta["full"]:
            res["highs_rule"] = run_highs(mps, args.time_limit, abs_gap=meta["smax"])
            res["cbc_rule"] = run_cbc(mps, args.time_limit, abs_gap=meta["smax"]) if have["cbc"] else \
                {"status": "cbc missing", "seconds": None}
        for k, v in res.items():
            print(f"   {k}: {v}", file=sys.stderr, flush=True)
        rows.append({"name": name, "options": opts, "meta": meta, "results": res})
        with open(os.path.join(args.out, "solvers.json"), "w") as f:
            json.dump({"time_limit": args.time_limit, "rel_gap": REL_GAP, "rows": rows}, f, indent=1)
    print(f"\nTime limit {args.time_limit:g} s, 1 thread, relative gap {REL_GAP:g}; E = makespan of the best "
          f"solution, (>=X) = makespan the dual bound proves.\n")
    print("| instance | columns x rows | HiGHS | CBC | GLPK | HiGHS, c4-synth rule | CBC, c4-synth rule |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        m, res = r["meta"], r["results"]
        extra = [cell(res[k], m) if k in res else "-" for k in ("highs_rule", "cbc_rule")]
        print(f"| {r['name']} | {m['columns']} x {m['rows']} | {cell(res['highs'], m)} | {cell(res['cbc'], m)} | "
              f"{cell(res['glpk'], m)} | {extra[0]} | {extra[1]} |")


def run_instances(args, coll, instances, extra, stem, results, baseline_key):
    """Runs c4-synth --coll COLL on each instance (args.only filters; `extra` options added), and once
    more with --solver greedy for the baseline makespan (greedy for allgather, direct for alltoall);
    writes results/rows as they come to args.out/`results` and returns the rows."""
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, opts in instances:
        if args.only and name not in args.only:
            continue
        out = os.path.join(args.out, f"{stem}{name}.json")
        cmd = [python(), TOOL, "--coll", coll, *opts, *extra, "--time-limit", str(args.time_limit), "--out", out]
        print(f"[{name}] {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        t = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.monotonic() - t
        sys.stderr.write(p.stdout[-2500:] + p.stderr[-1500:])
        if p.returncode != 0:
            rows.append({"name": name, "error": f"exit {p.returncode}", "wall_s": wall})
            continue
        with open(out) as f:
            info = json.load(f)["info"]
        subprocess.run([python(), TOOL, "--coll", coll, *opts, "--solver", "greedy", "--quiet", "--out",
                        out + ".baseline"], check=True)
        with open(out + ".baseline") as f:
            base = json.load(f)["info"]["epochs"]
        rows.append({"name": name, "options": opts, "info": info, baseline_key: base, "wall_s": wall})
        with open(os.path.join(args.out, results), "w") as f:
            json.dump({"time_limit": args.time_limit, "rows": rows}, f, indent=1)
    return rows


def quality(args):
    rows = run_instances(args, "allgather", QUALITY_INSTANCES, [], "", "quality.json", "greedy_epochs")
    print("\n| instance | mode | solver time | wall | epochs (greedy) | lower bound | above LB | predicted "
          "(1 MiB chunks) | algbw |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | {r['error']} | | {r['wall_s']:.0f} s | | | | | |")
            continue
        i = r["info"]
        above = (i["epochs"] - i["lower_bound_epochs"]) / i["lower_bound_epochs"] * 100
        opt = " (proven optimal)" if i.get("makespan_proven_optimal") else ""
        print(f"| {r['name']} | {i['mode']}{opt} | {i['solver_time_s']:.1f} s | {r['wall_s']:.0f} s | "
              f"{i['epochs']} ({r['greedy_epochs']}) | {i['lower_bound_epochs']} | {above:.1f}% | "
              f"{i['predicted_time_s'] * 1e3:.3f} ms | {i['algbw_GBps']:.2f} GB/s |")


def alltoall(args):
    rows = run_instances(args, "alltoall", A2A_INSTANCES, ["--always-solve"], "a2a-", "alltoall.json",
                         "direct_epochs")
    print("\n| instance | mode | LP solver time | wall | LP epochs | epochs (direct) | lower bound | above LB | "
          "predicted (1 MiB chunks) | algbw | relayed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | {r['error']} | | {r['wall_s']:.0f} s | | | | | | | |")
            continue
        i = r["info"]
        lbs = i.get("lower_bounds", {})
        which = max(lbs, key=lambda k: lbs[k]) if lbs else ""
        above = (i["epochs"] - i["lower_bound_epochs"]) / i["lower_bound_epochs"] * 100
        print(f"| {r['name']} | {i['mode']} | {i['solver_time_s']:.1f} s | {r['wall_s']:.0f} s | {i.get('lp_epochs')} | "
              f"{i['epochs']} ({r['direct_epochs']}) | {i['lower_bound_epochs']} ({which}) | {above:.1f}% | "
              f"{i['predicted_time_s'] * 1e3:.3f} ms | {i['algbw_GBps']:.2f} GB/s | {i['relayed']} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("solvers", "quality", "alltoall"))
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds per solve (solvers: 60) or per run (quality: 240)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench-results", "synth"))
    p.add_argument("--only", type=lambda s: s.split(","), default=None, help="instance names")
    args = p.parse_args()
    if args.time_limit is None:
        args.time_limit = 60.0 if args.what == "solvers" else 240.0
    {"solvers": solvers, "quality": quality, "alltoall": alltoall}[args.what](args)


if __name__ == "__main__":
    main()
