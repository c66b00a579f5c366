"""The AllGather time-expanded MILP (TE-CCL style, cut-through switches) and its solution with HiGHS.

Variables (docs/c4-synth.md, "Formulation"):
  f[l,c,k,q] in {0,1} chunk c starts crossing directed link l at epoch k in rate class q (a period
                      >= l's; direct host-to-host cables: q = l's period): it occupies l during
                      [k, k+q) at a share p_l / q of its capacity
  h[d,c,t] in [0,1]   rank d holds chunk c at epoch t (cumulative arrivals; integral through f)
  z[t]     in {0,1}   (full solve) not every rank holds every chunk at epoch t, LB <= t < E
Constraints:
  link occupancy    sum over (c, q, k in (t - q, t]) of (p_l / q) f[l,c,k,q] <= 1 (minus taken
                    capacity), in integer units (cap_units per epoch)
  switches          cut-through, no buffers, no copies: for every switch s, chunk c, epoch t and
                    class q: sum_{l out of s} f[l,c,t + alpha,q] = sum_{l into s} f[l,c,t,q]
  hosts             f[l,c,k,q] <= h[tail(l),c,k] for a chunk the tail did not start with (sends only
                    what it holds; copies to several links allowed); a chunk entering a host's in-link
                    at k in class q arrives at k + q + alpha; every rank receives a chunk at most once
  completion (full) h[d,c,E] = 1, and h[d,c,t] + z[t] >= 1, z[t] >= z[t+1]
Objective:
  full   minimize W * sum z + sum of arrival epochs  (W > twice the second sum: the makespan
         E* = LB + sum z first, then early arrivals; HiGHS stops once E* is proven, see solve())
  round  maximize sum of (H - arrival epoch) over the arrivals in the window (time partitioning:
         hosts start transfers in [t0, t1); paths started there are completed through switches).
Variables are pruned to those that can be part of a schedule: a chunk only where it can be by then
(earliest holding per host, then cut-through head times per class), only toward hosts that lack it,
only where the link has room; then switch flow conservation is propagated until every switch
variable has a partner.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from synth_core import INF, Transfer

try:
    import highspy
except ImportError:  # reported by c4_synth with the remedy (scripts/synth-venv.sh)
    highspy = None


class Infeasible(Exception):
    """The model has no solution by construction (e.g. a rank that cannot receive a chunk in time)."""


@dataclass
class Model:
    """A MILP in row-wise arrays plus what each column means."""
    ncols: int = 0
    cost: list = field(default_factory=list)
    upper: list = field(default_factory=list)
    integer: list = field(default_factory=list)
    # rows: (lower, upper, [(col, coef), ...])
    rows: list = field(default_factory=list)
    fvars: list = field(default_factory=list)  # col -> (link, chunk, k, class) for f columns, else None
    hvars: dict = field(default_factory=dict)  # (rank, chunk, t) -> col
    zvars: dict = field(default_factory=dict)  # t -> col
    full: bool = False
    weight: float = 0.0  # W (full)
    smax: float = 0.0  # largest possible sum of arrival epochs (full)
    lb: int = 0
    horizon: int = 0
    fcol: dict = field(default_factory=dict)  # (link, chunk, k, class) -> col

    def col(self, cost=0.0, upper=1.0, integer=True, f=None):
        self.cost.append(cost)
        self.upper.append(upper)
        self.integer.append(integer)
        self.fvars.append(f)
        self.ncols += 1
        return self.ncols - 1

    def row(self, lo, hi, terms):
        self.rows.append((lo, hi, terms))

    def stats(self):
        nz = sum(len(r[2]) for r in self.rows)
        nint = sum(1 for x in self.integer if x)
        return f"{self.ncols} columns ({nint} binary), {len(self.rows)} rows, {nz} nonzeros"


def build(topo, state, t0: int, t1: int, amax: int, full: bool, lb: int = 0, lookahead: float = 0.0) -> Model:
    """The model over host send epochs [t0, t1) with arrivals no later than amax, from `state`
    (held chunks, taken link capacity). full: every rank must hold every chunk by amax = t1 (makespan
    objective); else a round of time partitioning (arrival reward)."""
    links = topo.links
    a = topo.alpha
    cap = topo.cap_units
    n, C = state.n, state.C
    m = Model(full=full, lb=lb, horizon=amax)
    rank_of = {h: r for r, h in enumerate(topo.hosts)}
    lclasses = [topo.link_classes(l.id) for l in links]

    hz = amax + 1  # round reward: hz - arrival > 0
    smax = 0.0
    per_chunk = []
    for c in range(C):
        lacking = [r for r in range(n) if state.avail[r][c] == INF]
        if not lacking:
            continue
        holders = {r: max(int(state.avail[r][c]), t0) for r in range(n) if state.avail[r][c] != INF}
        hd = topo.host_dist(holders)  # earliest epoch each rank can hold c (holders: their own)
        host_t = {topo.hosts[r]: hd[r] for r in range(n) if hd[r] < INF}
        lack_nodes = {topo.hosts[r] for r in lacking}
        cand = set()
        for q in topo.classes:
            e = topo.ct_reach(q, host_t)
            rest_to = topo.ct_reach(q, {w: 0 for w in lack_nodes}, reverse=True)
            for l in links:
                if q not in lclasses[l.id]:
                    continue
                u, w = l.src, l.dst
                if topo.is_host[u]:
                    if u not in host_t:
                        continue
                    lo = max(t0, int(host_t[u]))
                else:
                    if e[u] == INF:
                        continue
                    lo = int(e[u])
                if topo.is_host[w]:
                    if w not in lack_nodes:
                        continue
                    rest = 0
                else:
                    rest = rest_to[w]
                    if rest == INF:
                        continue
                hi = amax - q - a - int(rest)
                if topo.is_host[u]:
                    hi = min(hi, t1 - 1)
                for k in range(lo, hi + 1):
                    if state.fits(l.id, k, q):
                        cand.add((l.id, k, q))
        # Switch flow conservation: drop variables without a partner until none is left.
        changed = True
        while changed:
            changed = False
            into = set()
            outof = set()
            for li, k, q in cand:
                l = links[li]
                if not topo.is_host[l.dst]:
                    into.add((l.dst, k + a, q))
                if not topo.is_host[l.src]:
                    outof.add((l.src, k, q))
            drop = set()
            for li, k, q in cand:
                l = links[li]
                if not topo.is_host[l.dst] and (l.dst, k + a, q) not in outof:
                    drop.add((li, k, q))
                if not topo.is_host[l.src] and (l.src, k, q) not in into:
                    drop.add((li, k, q))
            if drop:
                cand -= drop
                changed = True
        per_chunk.append((c, lacking, sorted(cand), hd))

    # f columns.
    for c, lacking, cand, hd in per_chunk:
        for li, k, q in cand:
            l = links[li]
            arr = k + q + a
            if topo.is_host[l.dst]:
                cost = float(arr) if full else float(arr - hz) - lookahead * (hd[rank_of[l.dst]] - t0)
            else:
                cost = 0.0
            col = m.col(cost, 1.0, True, (li, c, k, q))
            m.fcol[(li, c, k, q)] = col
    # Per (rank, chunk): arrivals, sends, holdings.
    need_epochs = range(lb, amax) if full else range(0)
    if full:
        for t in need_epochs:
            m.zvars[t] = m.col(0.0, 1.0, True)
        for t in need_epochs:
            if t + 1 in m.zvars:
                m.row(0.0, INF, [(m.zvars[t], 1.0), (m.zvars[t + 1], -1.0)])
    for c, lacking, cand, _ in per_chunk:
        arr = {}
        sends = {}
        for li, k, q in cand:
            l = links[li]
            if topo.is_host[l.dst]:
                arr.setdefault(rank_of[l.dst], []).append((k + q + a, m.fcol[(li, c, k, q)]))
            if topo.is_host[l.src]:
                sends.setdefault(rank_of[l.src], []).append((k, m.fcol[(li, c, k, q)]))
        for r in lacking:
            ar = sorted(arr.get(r, []))
            if full:
                if not ar:
                    raise Infeasible(f"rank {r} ({topo.nodes[topo.hosts[r]]}) cannot receive chunk {c} "
                                     f"within {amax} epochs")
                smax += ar[-1][0]
                m.row(1.0, 1.0, [(col, 1.0) for _, col in ar])
            elif ar:
                m.row(-INF, 1.0, [(col, 1.0) for _, col in ar])
            eps = sorted({k for k, _ in sends.get(r, [])} | set(need_epochs))
            prev_col, i = None, 0
            for t in eps:
                terms = [] if prev_col is None else [(prev_col, 1.0)]
                while i < len(ar) and ar[i][0] <= t:
                    terms.append((ar[i][1], 1.0))
                    i += 1
                col = m.col(0.0, 1.0, False)
                m.hvars[(r, c, t)] = col
                m.row(0.0, 0.0, [(col, -1.0)] + terms)
                prev_col = col
            for k, fc in sends.get(r, []):
                m.row(-INF, 0.0, [(fc, 1.0), (m.hvars[(r, c, k)], -1.0)])
            if full:
                for t in need_epochs:
                    m.row(1.0, INF, [(m.hvars[(r, c, t)], 1.0), (m.zvars[t], 1.0)])
    # Switch conservation (cut-through: what enters at t leaves at t + alpha, in the same class).
    flows = {}
    for c, lacking, cand, _ in per_chunk:
        for li, k, q in cand:
            l = links[li]
            col = m.fcol[(li, c, k, q)]
            if not topo.is_host[l.src]:
                flows.setdefault((l.src, c, k, q), []).append((col, 1.0))
            if not topo.is_host[l.dst]:
                flows.setdefault((l.dst, c, k + a, q), []).append((col, -1.0))
    for key in sorted(flows):
        m.row(0.0, 0.0, flows[key])
    # Link capacity per epoch, in units: a class-q column takes cap * p_l / q for q epochs.
    cover = {}
    for (li, c, k, q), col in m.fcol.items():
        u = topo.units(li, q)
        for t in range(k, k + q):
            cover.setdefault((li, t), []).append((col, float(u)))
    for key in sorted(cover):
        terms = cover[key]
        room = cap - state.used(*key)
        if sum(u for _, u in terms) > room:
            m.row(-INF, float(room), terms)
    if full:
        m.smax = smax
        m.weight = 2.0 * smax + 1.0
        for t, col in m.zvars.items():
            m.cost[col] = m.weight
    return m


@dataclass
class Result:
    status: str  # HiGHS model status text
    ok: bool  # a feasible solution exists
    optimal: bool
    transfers: list
    objective: float = math.nan
    bound: float = math.nan
    gap: float = math.nan  # HiGHS's relative MIP gap
    seconds: float = 0.0
    makespan: int = -1


@contextlib.contextmanager
def _quiet_stdout():
    """HiGHS prints its banner on stdout when constructed: drop it (c4-synth's report is on stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.close(devnull)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def to_highs(model: Model, verbose: bool = False):
    if highspy is None:
        raise RuntimeError("highspy is not installed")
    with _quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    if verbose:
        h.setOptionValue("log_to_console", True)
    lp = highspy.HighsLp()
    lp.num_col_ = model.ncols
    lp.num_row_ = len(model.rows)
    inf = highspy.kHighsInf
    lp.col_cost_ = np.array(model.cost, dtype=np.float64)
    lp.col_lower_ = np.zeros(model.ncols)
    lp.col_upper_ = np.array(model.upper, dtype=np.float64)
    lp.row_lower_ = np.array([-inf if r[0] == -INF else r[0] for r in model.rows], dtype=np.float64)
    lp.row_upper_ = np.array([inf if r[1] == INF else r[1] for r in model.rows], dtype=np.float64)
    starts = np.zeros(len(model.rows) + 1, dtype=np.int32)
    idx, val = [], []
    for i, (_, _, terms) in enumerate(model.rows):
        for col, coef in terms:
            idx.append(col)
            val.append(coef)
        starts[i + 1] = len(idx)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = model.ncols
    lp.a_matrix_.num_row_ = len(model.rows)
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = np.array(idx, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(val, dtype=np.float64)
    lp.integrality_ = [highspy.HighsVarType.kInteger if x else highspy.HighsVarType.kContinuous
                       for x in model.integer]
    st = h.passModel(lp)
    if st == highspy.HighsStatus.kError:
        raise RuntimeError("HiGHS refused the model")
    return h


def write_mps(model: Model, path: str) -> None:
    """The model as MPS (integer markers, minimization), for other solvers (bench/synth)."""
    h = to_highs(model)
    if h.writeModel(path) == highspy.HighsStatus.kError:
        raise RuntimeError(f"cannot write {path}")


def start_values(model: Model, topo, state, transfers) -> list:
    """Column values of a schedule (transfers booked on top of `state`), for a MIP start; None when a
    transfer uses a variable the model does not have."""
    x = [0.0] * model.ncols
    arrivals = {}
    for tr in transfers:
        for li, k in tr.links:
            col = model.fcol.get((li, tr.chunk, k, tr.rate))
            if col is None:
                return None
            x[col] = 1.0
        arrivals[(tr.dst, tr.chunk)] = tr.arrive
    for (r, c, t), col in model.hvars.items():
        a = arrivals.get((r, c))
        x[col] = 1.0 if a is not None and a <= t else 0.0
    if model.full:
        done = max((tr.arrive for tr in transfers), default=0)
        for t, col in model.zvars.items():
            x[col] = 1.0 if t < done else 0.0
    return x


def solve(model: Model, topo, state, time_limit: float, mip_gap=None, start=None, verbose=False,
          progress=None, seed: int = 0) -> Result:
    """Solves with HiGHS; returns the transfers of the best solution found (decomposed into paths).
    Full models stop once the makespan is proven optimal (absolute gap below W - smax) unless a
    relative gap `mip_gap` stops them earlier. `progress(text)` gets a line per improved solution."""
    h = to_highs(model, verbose)
    h.setOptionValue("time_limit", max(0.001, float(time_limit)))
    h.setOptionValue("random_seed", int(seed))
    if mip_gap is not None:
        h.setOptionValue("mip_rel_gap", float(mip_gap))
    if model.full:
        h.setOptionValue("mip_abs_gap", float(model.smax))
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start
        h.setSolution(sol)
    t_start = time.monotonic()
    if progress is not None:
        def improving(e):
            d = e.data_out
            text = f"objective {d.objective_function_value:.6g}, bound {d.mip_dual_bound:.6g}"
            if model.full:
                best = model.lb + int(d.objective_function_value // model.weight)
                text = f"makespan {best} epochs"
                if math.isfinite(d.mip_dual_bound):
                    low = model.lb + max(0, math.ceil((d.mip_dual_bound - model.smax) / model.weight - 1e-9))
                    text += f" (>= {min(low, best)} proven)"
            progress(f"  solution: {text} after {time.monotonic() - t_start:.1f} s")
        h.cbMipImprovingSolution.subscribe(improving)
    h.run()
    secs = time.monotonic() - t_start
    ms = h.getModelStatus()
    status = h.modelStatusToString(ms)
    info = h.getInfo()
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    res = Result(status=status, ok=has, optimal=ms == highspy.HighsModelStatus.kOptimal, transfers=[],
                 seconds=secs)
    if not has:
        return res
    res.objective = info.objective_function_value
    res.bound = info.mip_dual_bound
    res.gap = info.mip_gap
    x = list(h.getSolution().col_value)
    res.transfers = decompose(model, topo, x)
    res.makespan = max((t.arrive for t in res.transfers), default=0)
    return res


def decompose(model: Model, topo, x) -> list:
    """Splits the flow of a solution into host-to-host transfers: every unit leaving a host is
    followed through switches (at every switch, epoch and class, some unit of the same chunk leaves
    alpha epochs after one arrives, by flow conservation) to the host it reaches. With alpha = 0 a
    walk that comes back to a switch it passed (a cycle of flow at one epoch) is cut short."""
    links = topo.links
    a = topo.alpha
    rank_of = {h: r for r, h in enumerate(topo.hosts)}
    starts = []
    out = {}
    for col, fv in enumerate(model.fvars):
        if fv is None or x[col] < 0.5:
            continue
        li, c, k, q = fv
        l = links[li]
        if topo.is_host[l.src]:
            starts.append((k, c, li, q))
        else:
            out.setdefault((l.src, c, k, q), []).append(li)
    for v in out.values():
        v.sort(reverse=True)
    transfers = []
    for k, c, li, q in sorted(starts):
        path = [(li, k)]
        seen = {links[li].src: 0, links[li].dst: 1}
        t = k + a
        v = links[li].dst
        while not topo.is_host[v]:
            nxt = out.get((v, c, t, q))
            if not nxt:
                raise AssertionError(f"flow of chunk {c} ends in switch {topo.nodes[v]} at epoch {t}")
            lj = nxt.pop()
            path.append((lj, t))
            t += a
            v = links[lj].dst
            if a == 0 and v in seen:
                del path[seen[v]:]
                seen = {links[x].src: i for i, (x, _) in enumerate(path)}
                seen[v] = len(path)
            else:
                seen[v] = len(path)
        transfers.append(Transfer(rank_of[links[li].src], rank_of[v], c, k, k + q + a * len(path),
                                  tuple(path), q))
    return transfers
