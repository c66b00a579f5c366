"""AllToAll for c4-synth: a time-expanded LP over host-to-host segments (TE-CCL style), its rounding
to whole chunks, a list scheduler in the cut-through epoch model, the direct baseline and lower bounds.

Commodities: (s, d) for s != d, K chunks each (block b = s * n + d, chunk id (b * K) + part).

LP (docs/c4-synth.md, "AllToAll"), fluid, horizon T epochs:
  y[s,d,g,k] >= 0   amount (in chunks) of commodity (s,d) sent over segment g in epoch k. A segment
                    is a host-to-host path whose inner nodes are switches (topo.host_paths: fewest
                    hops in its class, direct cables included); its link i carries the amount in
                    epoch k + i*alpha (switches cut through, no buffers), and it is available at the
                    segment's end host from epoch k + 1 + hops*alpha on.
  capacity          per link l and epoch: sum of period_l * y over what crosses l then <= 1
                    (a link moves one chunk per period).
  source            sum of y of (s,d) leaving s <= K;  demand: sum of y of (s,d) reaching d = K
                    (reaching d by epoch T: the horizon bounds every variable).
  relay hosts       store and forward with buffers: I[x,s,d,t] >= 0 (held at x after epoch t's
                    sends) = I[x,s,d,t-1] + (arrivals available at t) - (sends in epoch t).
  objective         minimize sum of (epoch available at d) * y over the deliveries, + 0.01 per
                    link crossed (no useless detours): the demand arrives as early as it can.
The makespan is minimized by a search over T: the smallest T whose LP is feasible (binary search
between the lower bound and the direct schedule's makespan, at which the LP is feasible).
Variables exist only where a commodity can be by then and can still reach d by T (fluid earliest
and latest times over segments) and only on routes of at most `extra_hops` links more than its
fewest (relays through hosts included).

Whole chunks: each commodity's LP flow (summed over time) is split into routes s -> ... -> d (path
decomposition over segments), rounded to whole chunks by largest remainder (K in all), and the chunks
are list-scheduled in the epoch model of AllGather (a transfer of one chunk over a segment in its
class q: every link for q epochs, arrival q + hops * alpha later), earliest LP start first.
"""

from __future__ import annotations

import heapq
import math
import time

from synth_core import INF, Links, Transfer, finish_epochs, make_transfer, switch_cuts

COST_PER_LINK = 0.01
IPM_COLUMNS = 50000  # LPs with more columns are solved by HiGHS's interior point method


# -- segments and distances --------------------------------------------------------------------------
def segments(topo):
    """[(src rank, dst rank, links, class q)] from topo.host_paths (a segment per host path)."""
    out = []
    for r, lst in enumerate(topo.host_paths()):
        for lat, d, p, q in lst:
            out.append((r, d, tuple(p), q))
    return out


def _shortest(n, adj):
    """All-pairs shortest distances over adj[v] = [(w, cost)] (Dijkstra from every node)."""
    D = []
    for s in range(n):
        d = [INF] * n
        d[s] = 0
        heap = [(0, s)]
        while heap:
            t, v = heapq.heappop(heap)
            if t > d[v]:
                continue
            for w, c in adj[v]:
                if t + c < d[w]:
                    d[w] = t + c
                    heapq.heappush(heap, (d[w], w))
        D.append(d)
    return D


def hop_dist(n, segs):
    """H[a][b]: fewest links from rank a to rank b over segments (relays through hosts)."""
    adj = [[] for _ in range(n)]
    for a, b, p, _ in segs:
        adj[a].append((b, len(p)))
    return _shortest(n, adj)


def fluid_dist(n, segs, alpha, reverse=False):
    """F[a][b]: fewest epochs from a sending at epoch 0 to b holding the first piece (segment: 1 +
    hops * alpha; a relay sends from the epoch a piece is available). reverse: F[b][a]."""
    adj = [[] for _ in range(n)]
    for a, b, p, _ in segs:
        c = 1 + alpha * len(p)
        if reverse:
            adj[b].append((a, c))
        else:
            adj[a].append((b, c))
    return _shortest(n, adj)


# -- lower bound -------------------------------------------------------------------------------------
def lower_bound(topo, K: int) -> dict:
    """Lower bounds on the AllToAll makespan in epochs (every rank receives K chunks from every other
    one). A chunk takes `period` epochs' worth of capacity on every link it crosses and arrives at
    least alpha after its occupancy of the last link ends, so V chunks over links of periods p_i take
    T_V + alpha with T_V the least T with sum floor(T / p_i) >= V.
      - egress / ingress: a host sends and receives K (n-1) chunks over its own links;
      - cut: for every switch w, the set {w and the hosts whose every cable ends at w} sends |S| (n -
        |S|) K chunks over the links leaving it, and receives as many over the links entering it
        (leaf-spine: a leaf's uplinks);
      - volume: every chunk crosses at least the fewest links between its ends (relays included): the
        sum over commodities of K x fewest hops, over all links;
      - latency: the fewest epochs from s to d (whole chunks: the segment latencies).
    Returns {"epochs", "egress", "ingress", "cut", "volume", "latency"}."""
    n, a = topo.nranks, topo.alpha
    links = topo.links
    V = K * (n - 1)
    egress = ingress = 0
    for h in topo.hosts:
        egress = max(egress, finish_epochs([links[li].period for li in topo.out_links[h]], V) + a)
        ingress = max(ingress, finish_epochs([links[li].period for li in topo.in_links[h]], V) + a)
    cut = 0
    for inside, outp, inp in switch_cuts(topo):
        vol = inside * (n - inside) * K
        cut = max(cut, finish_epochs(outp, vol) + a, finish_epochs(inp, vol) + a)
    segs = segments(topo)
    H = hop_dist(n, segs)
    hops = sum(H[s][d] for s in range(n) for d in range(n) if s != d) * K
    volume = finish_epochs([l.period for l in links], hops) + a if n > 1 else 0
    lat = 0
    if n > 1:
        ld = [topo.host_dist({s: 0}) for s in range(n)]
        lat = int(max(ld[s][d] for s in range(n) for d in range(n)))
    ep = int(max(egress, ingress, cut, volume, lat))
    return {"epochs": ep, "egress": int(egress), "ingress": int(ingress), "cut": int(cut),
            "volume": int(volume), "latency": lat}


# -- whole-chunk schedules ---------------------------------------------------------------------------
def chunk_id(n, K, s, d, part):
    return (s * n + d) * K + part


def list_schedule(topo, K, items):
    """Schedules whole chunks in the epoch model. items: [(priority, chunk, [segments (a, b, links,
    q)])]: every epoch, every waiting chunk in priority order starts its next segment if every link
    of the segment's path, or of another path from a to b of no more latency (another spine), has
    room for its class then (a relay forwards from the epoch the chunk arrives). Returns the
    transfers."""
    cap = Links(topo)
    full = topo.cap_units
    a_ = topo.alpha
    alts = {}
    for r, lst in enumerate(topo.host_paths()):
        for lat, d, p, q in lst:
            alts.setdefault((r, d), []).append((lat, tuple(p), q))
    waiting = []  # (ready epoch, priority, chunk, route, index)
    for prio, c, route in items:
        if route:
            waiting.append((0, prio, c, route, 0))
    transfers = []
    t = 0
    idle = 0
    maxlat = max((seg[3] + a_ * len(seg[2]) for _, _, r in items for seg in r), default=1)
    while waiting:
        ready = sorted(w for w in waiting if w[0] <= t)
        later = [w for w in waiting if w[0] > t]
        nxt = []
        moved = False
        for rdy, prio, c, route, i in ready:
            a, b, path, q = route[i]
            lat = q + a_ * len(path)
            choice = None
            for p2, q2 in [(path, q)] + [(p2, q2) for l2, p2, q2 in alts.get((a, b), ())
                                         if l2 <= lat and p2 != path]:
                if cap.used(p2[0], t) < full and cap.path_fits(p2, t, q2):
                    choice = (p2, q2)
                    break
            if choice is None:
                nxt.append((rdy, prio, c, route, i))
                continue
            tr = make_transfer(topo, a, b, c, t, choice[0], choice[1])
            cap.take(tr)
            transfers.append(tr)
            moved = True
            if i + 1 < len(route):
                nxt.append((tr.arrive, prio, c, route, i + 1))
        waiting = later + nxt
        idle = 0 if moved else idle + 1
        if idle > 4 * maxlat + 64 and not later:
            raise RuntimeError("AllToAll list scheduler made no progress")
        t += 1
    return transfers


ORDERS = ("lp-start", "far-first", "rotation")


def best_schedule(topo, K, items):
    """list_schedule under several priority orders of the same routes; the shortest wins. Orders:
    the items' own priority (the LP's start, then (d - s) mod n), the routes with the most links
    first (a leaf-spine's uplinks are the bottleneck: keep them busy from epoch 0), and plain
    rotation ((d - s) mod n, part). Returns (transfers, order name)."""
    n = topo.nranks

    def rot(c):
        s, d = divmod(c // K, n)
        return ((d - s) % n, c % K)

    keyed = {
        "lp-start": [(prio, c, r) for prio, c, r in items],
        "far-first": [((-sum(len(g[2]) for g in r), rot(c)), c, r) for prio, c, r in items],
        "rotation": [(rot(c), c, r) for prio, c, r in items],
    }
    best = None
    for name in ORDERS:
        trs = list_schedule(topo, K, keyed[name])
        if best is None or makespan(trs) < makespan(best[0]):
            best = (trs, name)
    return best


def makespan(transfers):
    return max((tr.arrive for tr in transfers), default=0)


def direct_items(topo, K):
    """Every rank sends each of its blocks itself to the destination (c4comm's `direct`): chunk j of
    block (s, d) over the j-th (round robin) fewest-latency path from s to d, destinations in the
    order (d - s) mod n (no incast: at first every rank sends to its next one). Where no switch path
    joins s and d (NVLink meshes), the block goes over a fewest-latency chain of hosts."""
    n = topo.nranks
    paths = topo.host_paths()
    seg = topo.segment_latency()
    best_paths = []  # [s][d] -> [(path, q)] of the fewest latency
    for s in range(n):
        by_dst = {}
        for lat, d, p, q in paths[s]:
            by_dst.setdefault(d, []).append((lat, tuple(p), q))
        row = {}
        for d, ps in by_dst.items():
            b = min(x[0] for x in ps)
            row[d] = [(p, q) for lat, p, q in ps if lat == b]
        best_paths.append(row)
    items = []
    for s in range(n):
        dist = topo.host_dist({s: 0})
        for d in range(n):
            if d == s:
                continue
            # A fewest-latency chain of hosts s -> ... -> d (direct when a path joins them).
            chain = [d]
            while chain[-1] != s:
                v = chain[-1]
                u = min((u for u in range(n) if u != v and v in best_paths[u] and dist[u] + seg[u][v] == dist[v]),
                        key=lambda u: (u != s, u))
                chain.append(u)
            chain.reverse()
            for j in range(K):
                route = []
                for a, b in zip(chain, chain[1:]):
                    ps = best_paths[a][b]
                    p, q = ps[j % len(ps)]
                    route.append((a, b, p, q))
                items.append(((j, (d - s) % n), chunk_id(n, K, s, d, j), route))
    return items


def direct_schedule(topo, K):
    return best_schedule(topo, K, direct_items(topo, K))[0]


# -- the LP ------------------------------------------------------------------------------------------
class LP:
    """The AllToAll LP at horizon T (see the module docstring)."""

    def __init__(self, topo, K, T, extra_hops=1):
        from synth_milp import Model
        n, a = topo.nranks, topo.alpha
        self.topo, self.K, self.T = topo, K, T
        segs = segments(topo)
        self.segs = segs
        H = hop_dist(n, segs)
        F = fluid_dist(n, segs, a)
        m = Model()
        self.model = m
        self.vars = []  # col -> (s, d, segment index, k) or None
        cover = {}
        for s in range(n):
            for d in range(n):
                if s == d:
                    continue
                limit = H[s][d] + extra_hops
                # latest: fewest epochs from a host to d over segments allowed for (s,d)
                lt = [INF] * n
                lt[d] = 0
                ok_segs = [gi for gi, (x, y, p, q) in enumerate(segs)
                           if x != d and y != s and H[s][x] + len(p) + H[y][d] <= limit]
                changed = True
                while changed:
                    changed = False
                    for gi in ok_segs:
                        x, y, p, q = segs[gi]
                        c = 1 + a * len(p) + lt[y]
                        if c < lt[x]:
                            lt[x] = c
                            changed = True
                out_of = {}
                into = {}
                for gi in ok_segs:
                    x, y, p, q = segs[gi]
                    lo = F[s][x]
                    hi = T - 1 - a * len(p) - lt[y]
                    for k in range(int(lo), int(hi) + 1) if lo < INF and hi < INF else ():
                        avail = k + 1 + a * len(p)
                        cost = COST_PER_LINK * len(p) + (avail if y == d else 0.0)
                        col = m.col(cost, 1.0 / max(topo.links[li].period for li in p), False)
                        self.vars.append((s, d, gi, k))
                        out_of.setdefault(x, []).append((k, col))
                        into.setdefault(y, []).append((avail, col))
                        for i, li in enumerate(p):
                            cover.setdefault((li, k + i * a), []).append((col, float(topo.links[li].period)))
                if d not in into:
                    raise Infeasible(f"rank {s} cannot reach rank {d} within {T} epochs")
                m.row(float(K), float(K), [(col, 1.0) for _, col in into[d]])
                m.row(-INF, float(K), [(col, 1.0) for _, col in out_of.get(s, [])])
                for x in set(out_of) | set(into):
                    if x in (s, d):
                        continue
                    ev = {}
                    for k, col in out_of.get(x, []):
                        ev.setdefault(k, []).append((col, 1.0))
                    for t, col in into.get(x, []):
                        ev.setdefault(t, []).append((col, -1.0))
                    prev = None
                    for t in sorted(ev):
                        inv = m.col(0.0, INF, False)
                        self.vars.append(None)
                        terms = [(inv, 1.0)] + ev[t] + ([(prev, -1.0)] if prev is not None else [])
                        m.row(0.0, 0.0, terms)
                        prev = inv
        for key in sorted(cover):
            terms = cover[key]
            if len(terms) > 1:  # a single column is bounded by its upper bound (1 / its largest period)
                m.row(-INF, 1.0, terms)

    def solve(self, time_limit, verbose=False, seed=0):
        """(status text, feasible, seconds, solution values or None)."""
        import synth_milp
        h = synth_milp.to_highs(self.model, verbose)
        h.setOptionValue("time_limit", max(0.001, float(time_limit)))
        h.setOptionValue("random_seed", int(seed))
        if self.model.ncols > IPM_COLUMNS:  # large LPs: interior point, no crossover (any optimal flow will do)
            h.setOptionValue("solver", "ipm")
            h.setOptionValue("run_crossover", "off")
        t = time.monotonic()
        h.run()
        secs = time.monotonic() - t
        ms = h.getModelStatus()
        status = h.modelStatusToString(ms)
        ok = ms == synth_milp.highspy.HighsModelStatus.kOptimal
        x = list(h.getSolution().col_value) if ok else None
        return status, ok, secs, x

    def routes(self, x, eps=1e-7):
        """Per commodity (s, d): [(amount, mean start epoch of the first segment, [segment indices])]
        from the solution: the flow summed over time, decomposed into paths from s to d."""
        flow = {}
        start = {}
        for col, v in enumerate(self.vars):
            if v is None or x[col] <= eps:
                continue
            s, d, gi, k = v
            f = flow.setdefault((s, d), {})
            f[gi] = f.get(gi, 0.0) + x[col]
            st = start.setdefault((s, d), {})
            st[gi] = st.get(gi, 0.0) + x[col] * k
        out = {}
        for (s, d), f in flow.items():
            mean = {gi: start[(s, d)][gi] / f[gi] for gi in f}
            out_seg = {}
            for gi in f:
                out_seg.setdefault(self.segs[gi][0], []).append(gi)
            routes = []
            for _ in range(10000):
                # DFS from s to d over segments with flow left, earliest first.
                path, seen, v = [], {s}, s
                stack = [(s, [])]
                found = None
                while stack and found is None:
                    v, path = stack.pop()
                    cands = sorted((gi for gi in out_seg.get(v, []) if f[gi] > eps),
                                   key=lambda g: -mean[g])
                    for gi in cands:
                        w = self.segs[gi][1]
                        if w == d:
                            found = path + [gi]
                            break
                        if w not in seen:
                            seen.add(w)
                            stack.append((w, path + [gi]))
                if found is None:
                    break
                amt = min(f[gi] for gi in found)
                for gi in found:
                    f[gi] -= amt
                routes.append((amt, mean[found[0]], found))
            out[(s, d)] = routes
        return out


class Infeasible(Exception):
    pass


def largest_remainder(amounts, total):
    """Integers summing to `total`, proportional to `amounts` (largest remainder)."""
    s = sum(amounts)
    if s <= 0:
        return [total] + [0] * (len(amounts) - 1)
    exact = [a * total / s for a in amounts]
    base = [int(math.floor(e + 1e-9)) for e in exact]
    left = total - sum(base)
    order = sorted(range(len(amounts)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return base


def lp_items(topo, K, lp, x):
    """Whole-chunk routes from an LP solution: per commodity, its routes' amounts rounded to whole
    chunks (largest remainder, K in all); part j of the block goes on the routes in order of their
    LP start; priority = the route's mean LP start, then (d - s) mod n."""
    n = topo.nranks
    routes = lp.routes(x)
    items = []
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            rs = sorted(routes.get((s, d), []), key=lambda r: (r[1], r[2]))
            if not rs:
                raise RuntimeError(f"LP solution carries nothing from rank {s} to rank {d}")
            cnt = largest_remainder([r[0] for r in rs], K)
            part = 0
            for (amt, mean, segs), c in zip(rs, cnt):
                for j in range(c):
                    route = [lp.segs[gi] for gi in segs]
                    items.append(((mean, (d - s) % n, j), chunk_id(n, K, s, d, part), route))
                    part += 1
    return items


def check_alltoall(topo, K, transfers):
    """The transfers in the epoch model: cut-through paths and timing, link capacity, a relay sends
    a chunk only after it arrived, nobody receives a chunk twice or one of its own input, every
    destination gets every chunk of its blocks. Raises AssertionError."""
    from synth_core import check_transfer
    n = topo.nranks
    cap = Links(topo)
    held = {}
    for c in range(n * n * K):
        s, d = divmod(c // K, n)
        if s != d:
            held[(s, c)] = 0
    for tr in sorted(transfers, key=lambda t: (t.start, t.arrive)):
        check_transfer(topo, tr)
        cap.take(tr)
        if held.get((tr.src, tr.chunk), INF) > tr.start:
            raise AssertionError(f"rank {tr.src} sends chunk {tr.chunk} at {tr.start} before holding it")
        if (tr.dst, tr.chunk) in held:
            raise AssertionError(f"rank {tr.dst} receives chunk {tr.chunk}, which it holds")
        held[(tr.dst, tr.chunk)] = tr.arrive
    for c in range(n * n * K):
        s, d = divmod(c // K, n)
        if s != d and (d, c) not in held:
            raise AssertionError(f"rank {d} never gets chunk {c}")
