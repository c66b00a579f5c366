"""The AllGather epoch model's state, a greedy scheduler and lower bounds (pure Python).

Model (docs/c4-synth.md, "Formulation"): chunk c (0 <= c < nranks * K) starts at rank c // K. A
*transfer* moves one chunk from a host that holds it to a host that lacks it along a path whose
inner nodes are switches, at a rate class q (a period >= the path's bottleneck period). Switches cut
through (no buffers, no copies): link i of the path is occupied during [start + i*alpha, start +
i*alpha + q) at a share period_i / q of its capacity, and the chunk arrives at start + q + hops*alpha.
A link's shares at an epoch add up to at most 1. A host may send a chunk from the epoch it arrives
on, to several links at once (copies), and receives every chunk at most once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True)
class Transfer:
    """One chunk from rank src to rank dst along `links` [(link id, start epoch on it), ...] at rate
    class `rate` (epochs the transfer occupies each link)."""
    src: int
    dst: int
    chunk: int
    start: int
    arrive: int
    links: tuple
    rate: int = 1

    def key(self):
        """Order of the transfer among a rank's steps: identical on both ends (docs/schedules.md)."""
        return (self.start, self.arrive, self.chunk, self.src, self.dst, self.links)


class Links:
    """Link capacity per epoch in integer units (topo.cap_units per epoch and link)."""

    def __init__(self, topo):
        self.topo = topo
        self.busy = [[] for _ in topo.links]  # per link: units taken at each epoch

    def copy_from(self, other):
        self.busy = [list(b) for b in other.busy]
        return self

    def used(self, li: int, t: int) -> int:
        b = self.busy[li]
        return b[t] if t < len(b) else 0

    def fits(self, li: int, start: int, q: int) -> bool:
        """A class-q transfer fits on link li from `start` (q epochs)."""
        b = self.busy[li]
        room = self.topo.cap_units - self.topo.units(li, q)
        end = min(len(b), start + q)
        for x in range(start, end):
            if b[x] > room:
                return False
        return True

    def path_fits(self, path, start: int, q: int) -> bool:
        a = self.topo.alpha
        for i, li in enumerate(path):
            if not self.fits(li, start + i * a, q):
                return False
        return True

    def take(self, tr: Transfer) -> None:
        cap = self.topo.cap_units
        for li, t in tr.links:
            u = self.topo.units(li, tr.rate)
            b = self.busy[li]
            if len(b) < t + tr.rate:
                b.extend([0] * (t + tr.rate - len(b)))
            for x in range(t, t + tr.rate):
                if b[x] + u > cap:
                    raise AssertionError(f"link {self.topo.links[li].cable} over capacity at epoch {x}")
                b[x] += u


class State(Links):
    """What every rank holds (or will hold, from a booked transfer) and which link capacity is taken."""

    def __init__(self, topo, chunks_per_block: int):
        super().__init__(topo)
        self.K = chunks_per_block
        self.n = topo.nranks
        self.C = self.n * self.K
        # avail[r][c]: epoch from which rank r holds chunk c (INF: neither held nor on its way).
        self.avail = [[INF] * self.C for _ in range(self.n)]
        for r in range(self.n):
            for c in range(r * self.K, (r + 1) * self.K):
                self.avail[r][c] = 0
        self.transfers = []

    def copy(self):
        s = State.__new__(State)
        s.topo, s.K, s.n, s.C = self.topo, self.K, self.n, self.C
        s.avail = [row[:] for row in self.avail]
        s.busy = [list(b) for b in self.busy]
        s.transfers = list(self.transfers)
        return s

    def book(self, tr: Transfer) -> None:
        """Records a transfer: its link capacity and the destination's arrival."""
        check_transfer(self.topo, tr)
        self.take(tr)
        if self.avail[tr.dst][tr.chunk] != INF:
            raise AssertionError(f"rank {tr.dst} receives chunk {tr.chunk} twice")
        if not self.avail[tr.src][tr.chunk] <= tr.start:
            raise AssertionError(f"rank {tr.src} sends chunk {tr.chunk} at {tr.start} before holding it")
        self.avail[tr.dst][tr.chunk] = tr.arrive
        self.transfers.append(tr)

    def missing(self) -> int:
        """(rank, chunk) pairs neither held nor on their way."""
        return sum(1 for row in self.avail for a in row if a == INF)

    def makespan(self) -> int:
        return int(max((a for row in self.avail for a in row), default=0))


def check_transfer(topo, tr: Transfer) -> None:
    """A transfer's path and timing follow the cut-through model: a path from src to dst through
    switches, link i starting at start + i*alpha, class >= every period on it, arrival start + q +
    hops*alpha."""
    links, a = topo.links, topo.alpha
    v = topo.hosts[tr.src]
    for i, (li, t) in enumerate(tr.links):
        l = links[li]
        if l.src != v or (i and topo.is_host[v]):
            raise AssertionError(f"transfer of chunk {tr.chunk} from rank {tr.src}: link {l.cable} is not a path")
        if t != tr.start + i * a or tr.rate not in topo.link_classes(li):
            raise AssertionError(f"transfer of chunk {tr.chunk}: link {l.cable} at epoch {t} class {tr.rate}")
        v = l.dst
    if v != topo.hosts[tr.dst] or tr.arrive != tr.start + tr.rate + a * len(tr.links):
        raise AssertionError(f"transfer of chunk {tr.chunk} from rank {tr.src} to {tr.dst}: bad end or arrival")


def make_transfer(topo, src_rank, dst_rank, chunk, start, path, q) -> Transfer:
    a = topo.alpha
    links = tuple((li, start + i * a) for i, li in enumerate(path))
    return Transfer(src_rank, dst_rank, chunk, start, start + q + a * len(path), links, q)


def greedy(state: State, paths: list, t0: int = 0, t1: float = INF) -> list:
    """List scheduling in the epoch model, from `state` (changed in place): at every epoch from t0
    (hosts start transfers only before t1), every rank in a rotating order sends on each free path
    (shortest first, destinations rotating) a chunk the destination lacks, the one fewest ranks
    hold first. Returns the transfers booked. Stops when every rank holds or awaits every chunk."""
    topo, n, C = state.topo, state.n, state.C
    # Path groups per source rank: [(latency, [(dst, path, first link, class)])], destinations by
    # (dst - src) mod n.
    groups = []
    for r in range(n):
        g = {}
        for lat, d, p, q in paths[r]:
            g.setdefault(lat, []).append((d, p, p[0], q))
        groups.append([(lat, sorted(v, key=lambda x: ((x[0] - r) % n, x[1]))) for lat, v in sorted(g.items())])
    out_links = [topo.out_links[h] for h in topo.hosts]
    have = [0] * n
    pending = [0] * n
    count = [0] * C
    arrivals = {}
    for r in range(n):
        for c, a in enumerate(state.avail[r]):
            if a != INF:
                pending[r] |= 1 << c
                count[c] += 1
                if a <= t0:
                    have[r] |= 1 << c
                else:
                    arrivals.setdefault(int(a), []).append((r, c))
    full = (1 << C) - 1
    # Epochs without a new transfer after which the fabric cannot be connected: the longest path,
    # plus the longest an arrival can still be on its way.
    idle_limit = 2 * max((x[0] for p in paths for x in p), default=1) + 16
    cap = topo.cap_units
    booked = []
    t = t0
    idle = 0
    while t < t1 and any(p != full for p in pending):
        for r, c in arrivals.pop(t, ()):
            have[r] |= 1 << c
        progress = False
        for i in range(n):
            r = (i + t) % n
            if not have[r]:
                continue
            free_out = [li for li in out_links[r] if state.used(li, t) < cap]
            if not free_out:
                continue
            for lat, members in groups[r]:
                m = len(members)
                off = t % m
                for j in range(m):
                    d, p, first, q = members[(j + off) % m]
                    if first not in free_out:
                        continue
                    need = have[r] & ~pending[d]
                    if not need:
                        continue
                    # Every link of the path has room for the class-q share at its epochs.
                    if not state.path_fits(p, t, q):
                        continue
                    best, bestc = None, -1
                    x = need
                    while x:
                        b = x & -x
                        c = b.bit_length() - 1
                        x ^= b
                        if best is None or count[c] < best:
                            best, bestc = count[c], c
                    tr = make_transfer(topo, r, d, bestc, t, p, q)
                    state.book(tr)
                    booked.append(tr)
                    pending[d] |= 1 << bestc
                    count[bestc] += 1
                    arrivals.setdefault(tr.arrive, []).append((d, bestc))
                    if state.used(first, t) >= cap:
                        free_out.remove(first)
                    progress = True
                    if not free_out:
                        break
                if not free_out:
                    break
        idle = 0 if progress else idle + 1
        if idle > idle_limit and not any(k > t for k in arrivals):
            raise RuntimeError("greedy scheduler made no progress (disconnected fabric?)")
        t += 1
    return booked


# -- lower bounds ------------------------------------------------------------------------------------
def host_distances(topo) -> list:
    """dist[s][d]: earliest epoch rank d can hold a chunk that rank s holds at 0 (cut-through
    segments, relays through hosts)."""
    return [topo.host_dist({s: 0}) for s in range(topo.nranks)]


def first_arrivals(topo, dist, d) -> list:
    """[(earliest arrival epoch over l, largest class on l, period of l)] for the in-links l of
    rank d's host, for chunks d does not start with."""
    n, a = topo.nranks, topo.alpha
    h = topo.hosts[d]
    rank_of = {x: r for r, x in enumerate(topo.hosts)}
    out = []
    for li in topo.in_links[h]:
        l = topo.links[li]
        qs = topo.link_classes(li)
        first = math.inf
        if topo.is_host[l.src]:
            u = rank_of[l.src]
            first = min((dist[s][u] for s in range(n) if s != d), default=math.inf) + l.period + a
        else:
            # min over sources s != d of the class-q head time at l.src = one search from every
            # host at the earliest epoch it can hold some such chunk.
            src = {}
            for r in range(n):
                t = min((dist[s][r] for s in range(n) if s != d), default=math.inf)
                if r != d and t < math.inf:
                    src[topo.hosts[r]] = t
            for q in qs:
                first = min(first, topo.ct_reach(q, src)[l.src] + q + a)
        out.append((first, max(qs), l.period))
    return out


def finish_epochs(periods, volume) -> int:
    """Least T such that links of these periods can carry `volume` chunks within [0, T) (a chunk takes
    p epochs' worth of a link of period p): the least T with sum floor(T / p) >= volume."""
    if volume <= 0:
        return 0
    if not periods:
        return INF
    rate = sum(1.0 / p for p in periods)
    T = max(0, int(volume / rate) - 1)
    while sum(T // p for p in periods) < volume:
        T += 1
    return T


def switch_cuts(topo):
    """For every switch w that splits the hosts: (hosts inside, periods of the links leaving, periods of
    the links entering) the set {w and the hosts whose every cable ends at w} (leaf-spine: a leaf and
    its hosts, whose links out and in are the leaf's uplinks)."""
    links, n = topo.links, topo.nranks
    out = []
    for w in range(len(topo.nodes)):
        if topo.is_host[w]:
            continue
        S = {w}
        for h in topo.hosts:
            if {links[li].dst for li in topo.out_links[h]} == {w}:
                S.add(h)
        inside = len(S) - 1
        if inside == 0 or inside == n:
            continue
        out.append((inside, [l.period for l in links if l.src in S and l.dst not in S],
                    [l.period for l in links if l.dst in S and l.src not in S]))
    return out


def lower_bound(topo, K: int) -> dict:
    """Lower bounds on the AllGather makespan in epochs (every rank holds all nranks*K chunks).

    - ingress (per receiving host d, with release times): a chunk of source s cannot arrive before
      dist(s, d); for every threshold t, the chunks released at t or later must arrive in [t, E]
      over d's in-links. A chunk arriving over in-link l (period p) at a >= x = max(t, first_l) used
      p epochs' worth of l's capacity within [x - alpha - q_l, E - alpha) (q_l: the largest class on
      l), so l delivers at most floor((E - x + q_l) / p) of them (q_l = p: floor((E - x) / p) + 1).
      Includes the latency (diameter) bound.
    - egress (per source s): its K chunks each leave s once at least, each taking p epochs' worth of
      an out-link's capacity: the last first departure ends at >= T_K, the least T with
      sum over out-links of floor(T / p) >= K, and arrives alpha later: E >= T_K + alpha.
    - cut (per switch w splitting the hosts, switch_cuts): every chunk from a host outside the set S
      of w and its hosts must enter S at least once, over the links into S, and every chunk from
      inside must leave it: E >= finish_epochs(periods in, (n - |S|) K) + alpha, and the same out
      with |S| K (a leaf-spine's uplinks, which the ingress bound does not see).
    Returns {"epochs": max, "ingress": ..., "egress": ..., "diameter": ..., "cut": ...}.
    """
    n = topo.nranks
    dist = host_distances(topo)
    diameter = max((dist[s][d] for s in range(n) for d in range(n)), default=0)
    ingress = 0
    for d in range(n):
        rel = sorted(dist[s][d] for s in range(n) if s != d for _ in range(K))
        if not rel:
            continue
        ins = first_arrivals(topo, dist, d)

        def ok(E):
            for i, t in enumerate(rel):
                if i and rel[i - 1] == t:
                    continue
                m = len(rel) - i
                cap = 0
                for first, ql, p in ins:
                    x = max(t, first)
                    if E >= x:
                        cap += (E - x + ql) // p
                if cap < m:
                    return False
            return True

        E = int(rel[-1])
        while not ok(E):
            E += 1
        ingress = max(ingress, E)
    egress = 0
    for s in range(n):
        h = topo.hosts[s]
        if n > 1:
            T = 0
            while sum(T // topo.links[li].period for li in topo.out_links[h]) < K:
                T += 1
            egress = max(egress, T + topo.alpha)
    cut = 0
    for inside, outp, inp in switch_cuts(topo):
        cut = max(cut, finish_epochs(inp, (n - inside) * K) + topo.alpha, finish_epochs(outp, inside * K) + topo.alpha)
    return {"epochs": int(max(ingress, egress, diameter, cut)), "ingress": int(ingress), "egress": int(egress),
            "diameter": int(diameter), "cut": int(cut)}
