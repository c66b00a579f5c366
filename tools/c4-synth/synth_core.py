"""The AllGather epoch model's state, a greedy scheduler and lower bounds (pure Python).

Model (docs/c4-synth.md, "Formulation"): chunk c (0 <= c < nranks * K) starts at rank c // K. A
*transfer* moves one chunk from a host that holds it to a host that lacks it along a path whose
inner nodes are switches: it starts on the path's first link at epoch `start` and crosses link i at
start + (sum of the delays of the links before i) (switches forward at once: no buffers, no copies).
A link carries at most one chunk per period. A host may send a chunk from the epoch it arrives on,
to several links at once (copies), and receives every chunk at most once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True)
class Transfer:
    """One chunk from rank src to rank dst along `links` [(link id, start epoch on it), ...]."""
    src: int
    dst: int
    chunk: int
    start: int
    arrive: int
    links: tuple

    def key(self):
        """Order of the transfer among a rank's steps: identical on both ends (docs/schedules.md)."""
        return (self.start, self.arrive, self.chunk, self.src, self.dst, self.links)


class State:
    """What every rank holds (or will hold, from a booked transfer) and which link cells are taken."""

    def __init__(self, topo, chunks_per_block: int):
        self.topo = topo
        self.K = chunks_per_block
        self.n = topo.nranks
        self.C = self.n * self.K
        # avail[r][c]: epoch from which rank r holds chunk c (INF: neither held nor on its way).
        self.avail = [[INF] * self.C for _ in range(self.n)]
        for r in range(self.n):
            for c in range(r * self.K, (r + 1) * self.K):
                self.avail[r][c] = 0
        self.busy = [bytearray() for _ in topo.links]  # per link: 1 where an epoch is taken
        self.transfers = []

    def copy(self):
        s = State.__new__(State)
        s.topo, s.K, s.n, s.C = self.topo, self.K, self.n, self.C
        s.avail = [row[:] for row in self.avail]
        s.busy = [bytearray(b) for b in self.busy]
        s.transfers = list(self.transfers)
        return s

    def is_free(self, link: int, start: int) -> bool:
        b = self.busy[link]
        p = self.topo.links[link].period
        end = min(len(b), start + p)
        return not any(b[start:end]) if start < end else True

    def book(self, tr: Transfer) -> None:
        """Records a transfer: its link cells and the destination's arrival."""
        for li, t in tr.links:
            b = self.busy[li]
            p = self.topo.links[li].period
            if len(b) < t + p:
                b.extend(bytes(t + p - len(b)))
            for x in range(t, t + p):
                if b[x]:
                    raise AssertionError(f"link {self.topo.links[li].cable} booked twice at epoch {x}")
                b[x] = 1
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


def make_transfer(topo, src_rank, dst_rank, chunk, start, path) -> Transfer:
    t = start
    links = []
    for li in path:
        links.append((li, t))
        t += topo.links[li].delay
    return Transfer(src_rank, dst_rank, chunk, start, t, tuple(links))


def greedy(state: State, paths: list, t0: int = 0, t1: float = INF) -> list:
    """List scheduling in the epoch model, from `state` (changed in place): at every epoch from t0
    (hosts start transfers only before t1), every rank in a rotating order sends on each free path
    (shortest first, destinations rotating) a chunk the destination lacks, the one fewest ranks
    hold first. Returns the transfers booked. Stops when every rank holds or awaits every chunk."""
    topo, n, C = state.topo, state.n, state.C
    # Path groups per source rank: [(latency, [(dst, path, first link)])], destinations by (dst - src) mod n.
    groups = []
    for r in range(n):
        g = {}
        for lat, d, p in paths[r]:
            g.setdefault(lat, []).append((d, p, p[0]))
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
    idle_limit = 2 * max((lat for p in paths for lat, _, _ in p), default=1) + 16
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
            free_out = [li for li in out_links[r] if state.is_free(li, t)]
            if not free_out:
                continue
            for lat, members in groups[r]:
                m = len(members)
                off = t % m
                for j in range(m):
                    d, p, first = members[(j + off) % m]
                    if first not in free_out:
                        continue
                    need = have[r] & ~pending[d]
                    if not need:
                        continue
                    # Every link of the path free at its epoch.
                    tt = t
                    ok = True
                    for li in p:
                        if not state.is_free(li, tt):
                            ok = False
                            break
                        tt += topo.links[li].delay
                    if not ok:
                        continue
                    best, bestc = None, -1
                    x = need
                    while x:
                        b = x & -x
                        c = b.bit_length() - 1
                        x ^= b
                        if best is None or count[c] < best:
                            best, bestc = count[c], c
                    tr = make_transfer(topo, r, d, bestc, t, p)
                    state.book(tr)
                    booked.append(tr)
                    pending[d] |= 1 << bestc
                    count[bestc] += 1
                    arrivals.setdefault(tr.arrive, []).append((d, bestc))
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
    """dist[s][v]: earliest epoch a chunk that rank s holds at 0 can be at node v."""
    return [topo.dist_from({h: 0}) for h in topo.hosts]


def lower_bound(topo, K: int) -> dict:
    """Lower bounds on the AllGather makespan in epochs (every rank holds all nranks*K chunks).

    - ingress (per receiving host d, with release times): a chunk of source s cannot arrive before
      dist(s, d); for every threshold t, the chunks released at t or later must arrive in [t, E]
      over d's in-links, of which link l delivers at most floor((E - max(t, first_l)) / p_l) + 1
      (first_l: its earliest possible arrival). Includes the latency (diameter) bound.
    - egress (per source s): its K chunks leave on distinct (link, start) slots, the K-th at the
      K-th smallest start slot t_K of its out-links, and then still need the farthest host:
      E >= t_K + max_d dist(s, d).
    Returns {"epochs": max, "ingress": ..., "egress": ..., "diameter": ...}.
    """
    n = topo.nranks
    dist = host_distances(topo)
    diameter = max((dist[s][topo.hosts[d]] for s in range(n) for d in range(n)), default=0)
    ingress = 0
    for d in range(n):
        h = topo.hosts[d]
        rel = sorted(dist[s][h] for s in range(n) if s != d for _ in range(K))
        if not rel:
            continue
        ins = []
        for li in topo.in_links[h]:
            l = topo.links[li]
            first = min(dist[s][l.src] + l.delay for s in range(n) if s != d)
            ins.append((first, l.period))

        def ok(E):
            for i, t in enumerate(rel):
                if i and rel[i - 1] == t:
                    continue
                m = len(rel) - i
                cap = 0
                for first, p in ins:
                    x = max(t, first)
                    if E >= x:
                        cap += (E - x) // p + 1
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
        slots = sorted(k * topo.links[li].period for li in topo.out_links[h] for k in range(K))
        if n > 1:
            egress = max(egress, int(slots[K - 1] + max(dist[s][topo.hosts[d]] for d in range(n) if d != s)))
    return {"epochs": int(max(ingress, egress, diameter)), "ingress": int(ingress), "egress": int(egress),
            "diameter": int(diameter)}
