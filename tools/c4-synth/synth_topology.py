"""Fabric graphs for c4-synth: C4P topology files (docs/netlab.md, "Topology JSON") and generated ones.

A fabric is a directed multigraph. Nodes are hosts (one rank each, rank r = the r-th host in file
order) and switches (leaves, spines); every cable is two directed links, one per direction, with the
cable's rate. A host with several ports has one cable per port to its leaf. Generated fabrics may
also have direct host-to-host cables (line, ring, DGX-1 NVLink), parallel ones included.

The epoch model (docs/c4-synth.md) is derived here too: the epoch length tau is the time one chunk
takes on the fastest link; a link of rate r has period ceil(r_max / r) epochs per chunk. Switches cut
through: a transfer over a host-to-host path runs at the path's bottleneck period q, occupies every
link of the path for q epochs (at a share period / q of the faster ones) and arrives q + alpha x hops
epochs after it starts (alpha: a fixed per-hop latency in epochs).

Pure Python standard library (no numpy/highspy), so the checker and tests can use it anywhere.
"""

from __future__ import annotations

import fnmatch
import heapq
import json
import math
import re
from dataclasses import dataclass, field
from typing import Optional

FNV_OFFSET = 1469598103934665603
FNV_PRIME = 1099511628211
DEFAULT_GBPS = 100.0  # rate of a link whose rate_bps is 0 (netlab's "unshaped"), --default-gbps
NVLINK_GBPS = 200.0  # DGX-1 (V100) NVLink 2: 25 GB/s per direction per link

# DGX-1 (V100) hybrid cube-mesh: (gpu, gpu, NVLinks between them); every GPU has 6 NVLinks.
DGX1_NVLINKS = [(0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2),
                (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2)]


class TopologyError(Exception):
    """A topology that cannot be read or used; the message names the file and the entry."""


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 of `data`: the topology hash c4-plan prints and schedule files carry."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass
class Link:
    """One direction of a cable."""
    id: int
    cable: str  # the cable's name (both directions share it)
    src: int  # node ids
    dst: int
    bps: float
    reverse: int = -1  # the link of the other direction
    # Epoch model (set by Topology.set_epochs):
    period: int = 1  # epochs one chunk occupies the link
    delay: int = 1  # epochs from a chunk's start on the link to its arrival at dst


@dataclass
class Topology:
    """A fabric: nodes (hosts first-class, with ranks), directed links, and its epoch model."""
    source: str  # file path or generator spec
    nodes: list = field(default_factory=list)  # names
    is_host: list = field(default_factory=list)
    hosts: list = field(default_factory=list)  # node id of rank r
    links: list = field(default_factory=list)
    file_hash: Optional[int] = None  # FNV-1a 64 of the file's bytes (file topologies only)
    out_links: list = field(default_factory=list)  # node -> [link ids]
    in_links: list = field(default_factory=list)
    rate_max: float = 0.0
    alpha: int = 0

    # -- construction --------------------------------------------------------------------------------
    def add_node(self, name: str, host: bool) -> int:
        if name in self._names():
            raise TopologyError(f"{self.source}: node name \"{name}\" repeated")
        self.nodes.append(name)
        self.is_host.append(host)
        self.out_links.append([])
        self.in_links.append([])
        if host:
            self.hosts.append(len(self.nodes) - 1)
        return len(self.nodes) - 1

    def _names(self) -> dict:
        if not hasattr(self, "_name_index") or len(self._name_index) != len(self.nodes):
            self._name_index = {n: i for i, n in enumerate(self.nodes)}
        return self._name_index

    def node(self, name: str) -> int:
        return self._names()[name]

    def add_cable(self, cable: str, a: int, b: int, bps: float) -> None:
        if any(l.cable == cable for l in self.links):
            raise TopologyError(f"{self.source}: cable \"{cable}\" used twice")
        i = len(self.links)
        self.links.append(Link(i, cable, a, b, bps, i + 1))
        self.links.append(Link(i + 1, cable, b, a, bps, i))
        self.out_links[a].append(i)
        self.in_links[b].append(i)
        self.out_links[b].append(i + 1)
        self.in_links[a].append(i + 1)

    def cables(self) -> list:
        return sorted({l.cable for l in self.links})

    def set_rates(self, overrides: list) -> None:
        """Applies --rate PATTERN=GBPS overrides (fnmatch patterns over cable names, in order)."""
        for pattern, gbps in overrides:
            hit = False
            for l in self.links:
                if fnmatch.fnmatchcase(l.cable, pattern):
                    l.bps = gbps * 1e9
                    hit = True
            if not hit:
                names = self.cables()
                some = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
                raise TopologyError(f"--rate {pattern}={gbps:g}: no cable of {self.source} matches (cables: {some})")

    # -- epoch model ---------------------------------------------------------------------------------
    def set_epochs(self, alpha: int = 0) -> None:
        """Periods from the rates: period = ceil(rate_max / rate) epochs per chunk. Cut-through model
        (docs/c4-synth.md, "Formulation"): a transfer over a host-to-host path of h links whose inner
        nodes are switches runs at a rate class q (a period, at least the largest period on the path:
        the bottleneck); it occupies link i of the path during [start + i*alpha, start + i*alpha + q)
        at a share period_i / q of its capacity and arrives at start + q + h*alpha. `delay` (period +
        alpha) is the latency of a single link at its own rate. Capacities are counted in integer units:
        a link has `cap_units` (the lcm of all periods) per epoch, a class-q transfer takes
        cap_units * period / q of them."""
        if not self.links:
            raise TopologyError(f"{self.source}: no links")
        self.rate_max = max(l.bps for l in self.links)
        self.alpha = alpha
        for l in self.links:
            if not l.bps > 0:
                raise TopologyError(f"{self.source}: cable {l.cable} has rate {l.bps} bit/s")
            l.period = max(1, math.ceil(self.rate_max / l.bps - 1e-9))
            l.delay = l.period + alpha
        self.classes = sorted({l.period for l in self.links})
        q = 1
        for p in self.classes:
            q = q * p // math.gcd(q, p)
        self.cap_units = q
        self._seg = None
        self._paths = None

    def link_classes(self, li: int) -> list:
        """Rate classes a transfer may use on link li: its own period on a direct host-to-host cable
        (a one-link path), else every period of the fabric at least as long as the link's."""
        l = self.links[li]
        if self.is_host[l.src] and self.is_host[l.dst]:
            return [l.period]
        return [q for q in self.classes if q >= l.period]

    def units(self, li: int, q: int) -> int:
        """Capacity units (of cap_units per epoch) a class-q transfer takes on link li."""
        return self.cap_units * self.links[li].period // q

    def tau(self, chunk_bytes: float) -> float:
        """Seconds per epoch: one chunk on the fastest link."""
        return chunk_bytes * 8.0 / self.rate_max

    @property
    def nranks(self) -> int:
        return len(self.hosts)

    def host_names(self) -> list:
        return [self.nodes[h] for h in self.hosts]

    # -- distances and paths -------------------------------------------------------------------------
    def dist_from(self, sources: dict, switch_only: bool = False) -> list:
        """Store-and-forward distances (Dijkstra over link delays); only used for connectivity."""
        inf = math.inf
        d = [inf] * len(self.nodes)
        heap = []
        for v, t in sources.items():
            if t < d[v]:
                d[v] = t
                heap.append((t, v))
        heapq.heapify(heap)
        src = set(sources)
        while heap:
            t, v = heapq.heappop(heap)
            if t > d[v]:
                continue
            if switch_only and self.is_host[v] and v not in src:
                continue  # a host ends a switch-only path
            for li in self.out_links[v]:
                l = self.links[li]
                if t + l.delay < d[l.dst]:
                    d[l.dst] = t + l.delay
                    heapq.heappush(heap, (d[l.dst], l.dst))
        return d

    def ct_reach(self, q: int, sources: dict, reverse: bool = False) -> list:
        """Cut-through head times in rate class q: from `sources` {node: epoch} over the links with a
        switch end and period <= q (a path's inner nodes are switches: hosts other than the sources
        are reached but not passed), alpha epochs per link. Forward: result[v] is the earliest epoch a
        class-q path's link out of switch v can start (a host reached at x receives at x + q).
        reverse: result[v] is alpha x the fewest links from v to one of the sources (targets)."""
        inf = math.inf
        d = [inf] * len(self.nodes)
        heap = []
        for v, t in sources.items():
            if t < d[v]:
                d[v] = t
                heap.append((t, v))
        heapq.heapify(heap)
        src = set(sources)
        a = self.alpha
        while heap:
            t, v = heapq.heappop(heap)
            if t > d[v]:
                continue
            if self.is_host[v] and v not in src:
                continue
            for li in (self.in_links[v] if reverse else self.out_links[v]):
                l = self.links[li]
                if l.period > q or (self.is_host[l.src] and self.is_host[l.dst]):
                    continue
                w = l.src if reverse else l.dst
                if t + a < d[w]:
                    d[w] = t + a
                    heapq.heappush(heap, (d[w], w))
        return d

    def _switch_hops(self, src: int, q: int) -> list:
        """Fewest links from host src to every node over class-q links through switches only."""
        d = [math.inf] * len(self.nodes)
        d[src] = 0
        frontier = [src]
        while frontier:
            nxt = []
            for v in frontier:
                if self.is_host[v] and v != src:
                    continue
                for li in self.out_links[v]:
                    l = self.links[li]
                    if l.period > q or (self.is_host[l.src] and self.is_host[l.dst]):
                        continue
                    if d[l.dst] == math.inf:
                        d[l.dst] = d[v] + 1
                        nxt.append(l.dst)
            frontier = nxt
        return d

    def segment_latency(self) -> list:
        """seg[a][b]: the fewest epochs from rank a starting a transfer to rank b receiving it over
        one host-to-host path (min over classes q of q + alpha x hops, direct cables p + alpha)."""
        if self._seg is not None:
            return self._seg
        n = self.nranks
        inf = math.inf
        seg = [[inf] * n for _ in range(n)]
        rank_of = {h: r for r, h in enumerate(self.hosts)}
        for a, h in enumerate(self.hosts):
            seg[a][a] = 0
            for li in self.out_links[h]:
                l = self.links[li]
                if self.is_host[l.dst]:
                    b = rank_of[l.dst]
                    seg[a][b] = min(seg[a][b], l.period + self.alpha)
            for q in self.classes:
                hops = self._switch_hops(h, q)
                for b, w in enumerate(self.hosts):
                    if b != a and hops[w] < inf:
                        seg[a][b] = min(seg[a][b], q + self.alpha * hops[w])
        self._seg = seg
        return seg

    def host_dist(self, sources: dict) -> list:
        """Per rank: the earliest epoch it can hold a chunk that ranks `sources` {rank: epoch} hold
        (relays through hosts allowed: a host forwards from the epoch a chunk arrives). A source keeps
        its own epoch (it receives a chunk at most once)."""
        seg = self.segment_latency()
        n = self.nranks
        d = [math.inf] * n
        for r, t in sources.items():
            d[r] = min(d[r], t)
        done = [False] * n
        fixed = set(sources)
        while True:
            best, v = math.inf, -1
            for r in range(n):
                if not done[r] and d[r] < best:
                    best, v = d[r], r
            if v < 0:
                break
            done[v] = True
            row = seg[v]
            for w in range(n):
                if not done[w] and w not in fixed and best + row[w] < d[w]:
                    d[w] = best + row[w]
        return d

    def check_connected(self) -> None:
        d = self.dist_from({self.hosts[0]: 0}) if self.hosts else []
        for h in self.hosts:
            if d[h] == math.inf:
                raise TopologyError(f"{self.source}: host {self.nodes[h]} cannot be reached from "
                                    f"{self.nodes[self.hosts[0]]}")

    def host_paths(self, slack: Optional[int] = None, max_per_pair: int = 16) -> list:
        """Per rank: [(latency, dst rank, [link ids], class q)] of the host-to-host paths whose inner
        nodes are switches (direct cables included), simple, with q the path's bottleneck period and
        latency q + alpha x hops: a path is kept when it has the fewest hops among the paths to that
        host in its class and its latency is within `slack` epochs (default: the largest link period)
        of the shortest; at most max_per_pair per destination, sorted."""
        if slack is None:
            slack = max(l.period for l in self.links)
        if self._paths is not None and self._paths[0] == (slack, max_per_pair):
            return self._paths[1]
        rank_of = {h: r for r, h in enumerate(self.hosts)}
        seg = self.segment_latency()
        out = []
        for r, h in enumerate(self.hosts):
            hops_q = {q: self._switch_hops(h, q) for q in self.classes}
            hmax = max((x for hq in hops_q.values() for w, x in enumerate(hq)
                        if self.is_host[w] and w != h and x < math.inf), default=1)
            found = {}
            stack = [(h, [], 0, {h})]
            while stack:
                v, path, pm, seen = stack.pop()
                for li in self.out_links[v]:
                    l = self.links[li]
                    w = l.dst
                    if w in seen:
                        continue
                    q = max(pm, l.period)
                    hops = len(path) + 1
                    if self.is_host[w]:
                        if self.is_host[v] or hops == hops_q[q][w]:
                            lat = q + self.alpha * hops
                            if lat <= seg[r][rank_of[w]] + slack:
                                found.setdefault(w, []).append((lat, hops, path + [li], q))
                        continue
                    if self.is_host[v] and v != h:
                        continue
                    if hops < hmax:
                        stack.append((w, path + [li], q, seen | {w}))
                if len(stack) > 200000:
                    raise TopologyError(f"{self.source}: too many switch paths from {self.nodes[h]}")
            lst = []
            for w, ps in found.items():
                ps.sort(key=lambda p: (p[0], p[1], p[2]))
                for lat, _, p, q in ps[:max_per_pair]:
                    lst.append((lat, rank_of[w], p, q))
            lst.sort(key=lambda x: (x[0], x[1], x[2]))
            out.append(lst)
        self._paths = ((slack, max_per_pair), out)
        return out

    def describe(self) -> str:
        nsw = sum(1 for x in self.is_host if not x)
        rates = sorted({l.bps for l in self.links})
        rtxt = "/".join(f"{b / 1e9:g}" for b in rates)
        return (f"{self.source}: {self.nranks} hosts, {nsw} switches, {len(self.links) // 2} cables "
                f"({rtxt} Gbit/s)")


# -- C4P topology files ------------------------------------------------------------------------------
def _req(obj, key, where, kind):
    if not isinstance(obj, dict):
        raise TopologyError(f"{where}: not an object")
    if key not in obj:
        raise TopologyError(f"{where}: no \"{key}\"")
    v = obj[key]
    if kind is str and not (isinstance(v, str) and v):
        raise TopologyError(f"{where}: \"{key}\" is not a non-empty string")
    if kind is list and not isinstance(v, list):
        raise TopologyError(f"{where}: \"{key}\" is not an array")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise TopologyError(f"{where}: \"{key}\" is not a number")
    return v


def _entry(arr, i, obj):
    name = obj.get("name") if isinstance(obj, dict) else None
    return f"{arr}[{i}]" + (f" ({name})" if isinstance(name, str) else "")


def load_file(path: str, default_gbps: Optional[float] = None) -> Topology:
    """Reads a C4P topology file as libc4comm/planner/topology.cc does: links (name, rate_bps; 0 means
    unshaped and gets default_gbps), spines, leaves with uplinks, hosts with ports on leaves."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TopologyError(f"topology {path}: cannot be read: {e.strerror}") from None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise TopologyError(f"topology {path}: not valid JSON ({e})") from None
    src = path
    if not isinstance(doc, dict):
        raise TopologyError(f"topology {src}: not a JSON object")
    if doc.get("version") != 1:
        raise TopologyError(f"topology {src}: version {doc.get('version')!r}; c4-synth reads version 1")
    t = Topology(source=src, file_hash=fnv1a64(data))

    cable_bps = {}
    for i, l in enumerate(_req(doc, "links", f"{src} top level", list)):
        where = f"{src} " + _entry("links", i, l)
        name = _req(l, "name", where, str)
        bps = float(_req(l, "rate_bps", where, float))
        if bps < 0 or not math.isfinite(bps):
            raise TopologyError(f"{where}: rate_bps = {bps:g}")
        if name in cable_bps:
            raise TopologyError(f"{where}: link name repeated")
        cable_bps[name] = bps if bps > 0 else (default_gbps or DEFAULT_GBPS) * 1e9

    def cable(where, obj):
        name = _req(obj, "link", where, str)
        if name not in cable_bps:
            raise TopologyError(f"{where}: names link \"{name}\", which is not in links")
        return name, cable_bps[name]

    spines = doc.get("spines", [])
    if not isinstance(spines, list):
        raise TopologyError(f"{src} top level: \"spines\" is not an array")
    leaves = _req(doc, "leaves", f"{src} top level", list)
    hosts = _req(doc, "hosts", f"{src} top level", list)
    kind = {}
    # Hosts first so that node ids of hosts follow rank order; switches after.
    for i, h in enumerate(hosts):
        where = f"{src} " + _entry("hosts", i, h)
        name = _req(h, "name", where, str)
        if name in kind:
            raise TopologyError(f"{where}: host name repeated")
        kind[name] = "host"
        t.add_node(name, True)
    for i, s in enumerate(spines):
        where = f"{src} " + _entry("spines", i, s)
        name = _req(s, "name", where, str)
        if name in kind:
            raise TopologyError(f"{where}: switch name repeated")
        kind[name] = "spine"
    for i, l in enumerate(leaves):
        where = f"{src} " + _entry("leaves", i, l)
        name = _req(l, "name", where, str)
        if name in kind:
            raise TopologyError(f"{where}: switch name repeated")
        kind[name] = "leaf"
        t.add_node(name, False)
    for s in spines:
        t.add_node(s["name"], False)
    for i, l in enumerate(leaves):
        where = f"{src} " + _entry("leaves", i, l)
        ups = l.get("uplinks", [])
        if not isinstance(ups, list):
            raise TopologyError(f"{where}: \"uplinks\" is not an array")
        for u, up in enumerate(ups):
            uw = f"{where} uplinks[{u}]"
            spine = _req(up, "spine", uw, str)
            if kind.get(spine) != "spine":
                raise TopologyError(f"{uw}: names spine \"{spine}\", which is not in spines")
            name, bps = cable(uw, up)
            t.add_cable(name, t.node(l["name"]), t.node(spine), bps)
        for p, pj in enumerate(l.get("ports", []) if isinstance(l.get("ports", []), list) else []):
            hn = pj.get("host") if isinstance(pj, dict) else None
            if isinstance(hn, str) and kind.get(hn) != "host":
                raise TopologyError(f"{where} ports[{p}]: names host \"{hn}\", which is not in hosts")
    for i, h in enumerate(hosts):
        where = f"{src} " + _entry("hosts", i, h)
        ports = _req(h, "ports", where, list)
        if not ports:
            raise TopologyError(f"{where}: no ports")
        for p, pj in enumerate(ports):
            pw = f"{where} ports[{p}]"
            pname = _req(pj, "name", pw, str)
            leaf = pj.get("leaf") if isinstance(pj, dict) else None
            if not isinstance(leaf, str) or not leaf:
                raise TopologyError(f"{pw}: port {h['name']}/{pname} is on no leaf (no \"leaf\" field)")
            if kind.get(leaf) != "leaf":
                raise TopologyError(f"{pw}: port {h['name']}/{pname} names leaf \"{leaf}\", which is not in leaves")
            name, bps = cable(pw, pj)
            t.add_cable(name, t.node(h["name"]), t.node(leaf), bps)
    if not t.hosts:
        raise TopologyError(f"topology {src}: no hosts")
    t.check_connected()
    return t


# -- generated fabrics -------------------------------------------------------------------------------
GEN_HELP = ("line:N | ring:N | star:N | leafspine:HOSTS,LEAVES,SPINES[,HOSTGBPS,UPGBPS] | dgx1  "
            "(host names h0.., gpu0.. for dgx1; cables h0-h1 (parallel ones h0-h1.1 ...), h0p0-leaf0, "
            "leaf0-spine0, h0p0-sw0, gpu0-gpu3)")


def generate(spec: str, ports: int = 1, default_gbps: Optional[float] = None) -> Topology:
    """A generated fabric from --gen SPEC (GEN_HELP). `ports`: cables per host (to its switch) or per
    adjacent host pair (line, ring). Rates not in the spec: default_gbps, else 100 Gbit/s (200 for
    DGX-1's NVLinks)."""
    m = re.fullmatch(r"([a-z0-9]+)(?::([0-9.,]+))?", spec.strip())
    if not m:
        raise TopologyError(f"--gen {spec}: expected {GEN_HELP}")
    kind, args = m.group(1), m.group(2)
    nums = [] if not args else args.split(",")

    def ints(n_min, n_max):
        if not (n_min <= len(nums) <= n_max):
            raise TopologyError(f"--gen {spec}: {kind} takes {n_min}-{n_max} numbers ({GEN_HELP})")
        out = []
        for x in nums:
            try:
                out.append(float(x))
            except ValueError:
                raise TopologyError(f"--gen {spec}: \"{x}\" is not a number") from None
        return out

    if ports < 1:
        raise TopologyError(f"--ports {ports}: at least 1")
    gbps = (default_gbps or DEFAULT_GBPS) * 1e9
    t = Topology(source=f"gen:{spec}")
    if kind in ("line", "ring", "star"):
        (n,) = ints(1, 1)
        n = int(n)
        if n < 2 or n > 1024:
            raise TopologyError(f"--gen {spec}: 2-1024 hosts")
        if kind == "ring" and n < 3:
            raise TopologyError(f"--gen {spec}: a ring has at least 3 hosts (line:2 --ports 2 for two cables)")
        for i in range(n):
            t.add_node(f"h{i}", True)
        if kind == "star":
            sw = t.add_node("sw0", False)
            for i in range(n):
                for p in range(ports):
                    t.add_cable(f"h{i}p{p}-sw0", i, sw, gbps)
        else:
            pairs = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if kind == "ring" else [])
            for a, b in pairs:
                for p in range(ports):
                    t.add_cable(f"h{a}-h{b}" + (f".{p}" if p else ""), a, b, gbps)
    elif kind == "leafspine":
        v = ints(3, 5)
        hosts, leaves, spines = int(v[0]), int(v[1]), int(v[2])
        host_bps = v[3] * 1e9 if len(v) > 3 else gbps
        up_bps = (v[4] if len(v) > 4 else host_bps / 1e9) * 1e9
        if not (1 <= leaves <= hosts <= 4096) or spines < (1 if leaves > 1 else 0) or spines > 256:
            raise TopologyError(f"--gen {spec}: needs 1 <= LEAVES <= HOSTS, and SPINES >= 1 with several leaves")
        for h in range(hosts):
            t.add_node(f"h{h}", True)
        leaf = [t.add_node(f"leaf{l}", False) for l in range(leaves)]
        spine = [t.add_node(f"spine{s}", False) for s in range(spines)] if leaves > 1 else []
        for l in range(leaves):
            for s in range(len(spine)):
                t.add_cable(f"leaf{l}-spine{s}", leaf[l], spine[s], up_bps)
        for h in range(hosts):
            lf = h * leaves // hosts  # as netlab's and C4P's leafSpine() place hosts
            for p in range(ports):
                t.add_cable(f"h{h}p{p}-leaf{lf}", h, leaf[lf], host_bps)
    elif kind == "dgx1":
        ints(0, 0)
        for g in range(8):
            t.add_node(f"gpu{g}", True)
        nv = (default_gbps or NVLINK_GBPS) * 1e9
        for a, b, n in DGX1_NVLINKS:
            for p in range(n):
                t.add_cable(f"gpu{a}-gpu{b}" + (f".{p}" if p else ""), a, b, nv)
    else:
        raise TopologyError(f"--gen {spec}: unknown fabric \"{kind}\" ({GEN_HELP})")
    t.check_connected()
    return t
