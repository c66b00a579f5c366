"""Tests of c4-synth (tools/c4-synth, docs/c4-synth.md) on fabrics whose optimal AllGather makespans
are worked out by hand (in each test's docstring), the derived ReduceScatter / AllReduce files, the
schedule checker, bad inputs and the no-schedule exit code.

Epoch model: one epoch = one chunk on the fastest link; a chunk crossing a link of period p arrives
p epochs after it starts; switches cut through (no buffers, no copies): a host-to-host transfer over
switches takes the bottleneck period q of its path (alpha = 0), occupying every link of it for q
epochs; hosts forward from the epoch a chunk arrives. E = the epoch at which the last chunk arrives.
AllToAll: blocks s*n + d, relays through hosts allowed (tests at the end).

Run: .venv-synth/bin/python -m pytest -q tests/synth  (ctest -L synth). With C4_SCHED_CHECK set to an
executable or command (the C++ loader's checks: "build/bin/c4-sim check"), every synthesized file must
also pass `$C4_SCHED_CHECK FILE`.
"""

import copy
import json
import os
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL_DIR = os.path.join(ROOT, "tools", "c4-synth")
TOOL = os.path.join(TOOL_DIR, "c4_synth.py")
sys.path.insert(0, TOOL_DIR)

import c4_synth  # noqa: E402
import synth_check  # noqa: E402

EXIT_USAGE = 2
EXIT_NO_SCHEDULE = 3
MILP = ("--always-solve",)  # solve also where the greedy schedule meets the lower bound


def run_tool(*args, expect=0):
    p = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == expect, f"c4-synth {' '.join(args)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def check_file(path):
    """The pure-Python checker, and the C++ one when C4_SCHED_CHECK names it."""
    st = synth_check.check_file(path)
    ext = os.environ.get("C4_SCHED_CHECK")
    if ext:  # an executable, or a command line such as "build/bin/c4-sim check"
        p = subprocess.run([*shlex.split(ext), path], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"{ext} {path}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return st


def synth(tmp_path, coll, *args, name="out"):
    out = str(tmp_path / f"{name}-{coll}.json")
    run_tool("--coll", coll, "--out", out, *args)
    check_file(out)
    with open(out) as f:
        return json.load(f), out


def allgather_epochs(tmp_path, *args):
    doc, _ = synth(tmp_path, "allgather", *args)
    return doc["info"]["allgather_epochs"], doc


def messages(doc):
    """Per rank: (sends, receives)."""
    out = []
    for rk in doc["ranks"]:
        s = sum(1 for x in rk["steps"] if x["op"] in ("send", "send-partial"))
        out.append((s, len(rk["steps"]) - s))
    return out


def in_process(*argv):
    """(topology, state, lower bound, report) of a synthesis run in this process."""
    args = c4_synth.build_parser().parse_args(["--quiet", "--out", "unused.json", *argv])
    return c4_synth.run_synthesis(args)


def test_line3(tmp_path):
    """h0 - h1 - h2. K=1: h0 needs 2 chunks over its only in-link (one per epoch, the first at
    epoch 1), so E >= 2, and E = 2 is met (h1 forwards both ends' chunks at epoch 1).
    K=2: h0 needs 4 chunks over one link: E >= 4; met (h1 sends its own two first)."""
    e, doc = allgather_epochs(tmp_path, "--gen", "line:3", *MILP)
    assert e == 2 and doc["info"]["lower_bound_epochs"] == 2
    assert doc["info"]["makespan_proven_optimal"] is True and doc["info"]["method"] == "milp"
    assert "topology" not in doc  # generated fabrics carry no topology hash
    e, _ = allgather_epochs(tmp_path, "--gen", "line:3", "--chunks", "2", *MILP)
    assert e == 4


def test_ring4(tmp_path):
    """Bidirectional ring of 4. K=1: each host gets 2 chunks at epoch 1 (its neighbours') and the
    opposite one at 2: E = 2 (diameter). K=2: 6 chunks over 2 in-links, one each per epoch from
    epoch 1: E >= 3, and 8 links x 3 epochs = 24 = 4 hosts x 6 receipts: met with every link busy."""
    assert allgather_epochs(tmp_path, "--gen", "ring:4", *MILP)[0] == 2
    assert allgather_epochs(tmp_path, "--gen", "ring:4", "--chunks", "2", *MILP)[0] == 3


def test_star_no_switch_copies(tmp_path):
    """4 hosts on one switch, K=1. Each host receives 3 chunks over its one downlink, the first at
    epoch 1 (cut-through: host -> switch -> host takes one period): E >= 3. Without copies in the
    switch every receipt is a separate transfer from a host, and uplinks can start only at epochs
    0-2 (to arrive by 3): 4 x 3 = 12 sends for 12 receipts, so E = 3 needs every uplink busy at
    0, 1, 2 (met: at epoch t host i sends its own chunk to host i + t + 1 mod 4): each rank sends
    exactly 3 messages and receives 3.
    (Store-and-forward model before: first arrival at 2 (uplink + downlink), E = 4.)"""
    e, doc = allgather_epochs(tmp_path, "--gen", "star:4", *MILP)
    assert e == 3
    assert messages(doc) == [(3, 3)] * 4
    _, state, _, _ = in_process("--gen", "star:4", "--coll", "allgather", *MILP)
    # Every transfer is one unit through the switch (host -> sw -> host), and no link cell is shared.
    cells = set()
    for tr in state.transfers:
        assert len(tr.links) == 2 and tr.arrive == tr.start + 1
        for cell in tr.links:
            assert cell not in cells
            cells.add(cell)


def test_unequal_parallel_links(tmp_path):
    """Two hosts, two direct cables: 100 and 25 Gbit/s (periods 1 and 4). K=5 chunks each way: the
    fast cable alone needs 5 epochs; with both, the fast one carries 4 chunks (arriving at 1..4) and
    the slow one 1 (arriving at 4): E = 4, both used in proportion 4:1 in each direction."""
    args = ["--gen", "line:2", "--ports", "2", "--rate", "h0-h1.1=25", "--chunks", "5", *MILP]
    e, _ = allgather_epochs(tmp_path, *args)
    assert e == 4
    topo, state, lb, _ = in_process(*args, "--coll", "allgather")
    assert lb == 4
    use = {}
    for tr in state.transfers:
        (li, _), = tr.links
        key = (tr.src, topo.links[li].cable)
        use[key] = use.get(key, 0) + 1
    assert use == {(0, "h0-h1"): 4, (0, "h0-h1.1"): 1, (1, "h0-h1"): 4, (1, "h0-h1.1"): 1}


def test_dgx1(tmp_path):
    """DGX-1 (V100) NVLink cube-mesh, K=1: every GPU has 4 neighbours (6 NVLinks) and the other 3
    GPUs at distance 2, so E >= 2; met (4 chunks arrive at 1, 3 at 2). The greedy schedule already
    meets the bound: by default it is kept without a MILP (optimal by the bound)."""
    assert allgather_epochs(tmp_path, "--gen", "dgx1", *MILP)[0] == 2
    e, doc = allgather_epochs(tmp_path, "--gen", "dgx1")
    assert e == 2 and doc["info"]["method"] == "greedy" and doc["info"]["makespan_proven_optimal"] is True


def test_cut_through_star2(tmp_path):
    """Two hosts on one switch, K=1 and K=3. Cut-through: a chunk crosses host -> switch -> host in
    one period, so K=1: E = 1 (store-and-forward: 2, a period per link), and K=3: E = 3 (each
    direction's 3 chunks back to back over the host's one cable; store-and-forward: 4)."""
    e, doc = allgather_epochs(tmp_path, "--gen", "star:2", *MILP)
    assert e == 1 and doc["info"]["lower_bound_epochs"] == 1
    assert allgather_epochs(tmp_path, "--gen", "star:2", "--chunks", "3", *MILP)[0] == 3


def test_cut_through_slow_uplink(tmp_path):
    """leafspine:4,2,1 (h0, h1 on leaf0; h2, h3 on leaf1; one spine), host links 100 Gbit/s (period
    1), uplinks 25 Gbit/s (period 4), K=1. Cut-through at the bottleneck: a cross-leaf chunk takes
    the class-4 rate on its whole path and arrives 4 epochs after it starts (store-and-forward:
    1 + 4 + 4 + 1 = 10). A class-4 transfer takes the whole uplink for 4 epochs, so each direction
    carries one chunk per 4 epochs. Leaf1 needs both c0 and c1, i.e. two crossings of leaf0 ->
    spine (without switch copies): the second ends at >= 8 at one host of leaf1 and must still
    reach the other one, by a relay (+1: 9) or a third crossing (>= 12): E >= 9, and E = 9 is met
    (c0 -> h2 and c2 -> h0 over [0, 4), c1 -> h3 and c3 -> h1 over [4, 8), relays next door).
    The ingress bound is only 4 here; the cut bound (both chunks of leaf0 must enter leaf1 over its
    one uplink of period 4) gives 8; HiGHS proves 9. The derived ReduceScatter and AllReduce take 9
    and 18."""
    args = ["--gen", "leafspine:4,2,1", "--rate", "leaf*-spine*=25", *MILP]
    e, doc = allgather_epochs(tmp_path, *args)
    assert e == 9 and doc["info"]["makespan_proven_optimal"] is True
    topo, state, lb, _ = in_process(*args, "--coll", "allgather")
    assert lb == 8
    for tr in state.transfers:
        if len(tr.links) == 4:  # cross-leaf: the bottleneck's period on every link, not their sum
            assert tr.rate == 4 and tr.arrive == tr.start + 4
        else:  # same leaf: class 1, or a slower class where that costs nothing
            assert len(tr.links) == 2 and tr.arrive == tr.start + tr.rate
    ar, _ = synth(tmp_path, "allreduce", *args)
    assert ar["info"]["epochs"] == 18


LEAF_SPINE = {
    "version": 1, "name": "ls4", "subnet": "10.9.0.0/16", "netns_prefix": "nl-ls4-", "placement": "host",
    "hosts": [{"name": f"h{h}", "index": h, "netns": f"nl-ls4-h{h}",
               "ports": [{"name": "p0", "index": 0, "ifname": "p0", "addr": f"10.9.{h}.2", "prefix_len": 30,
                          "subnet": f"10.9.{h}.0/30", "gateway": f"10.9.{h}.1", "leaf": f"leaf{h // 2}",
                          "link": f"h{h}p0-leaf{h // 2}", "rate_bps": 1000000000}]} for h in range(4)],
    "leaves": [{"name": f"leaf{l}", "index": l, "netns": f"nl-ls4-leaf{l}",
                "ports": [{"host": f"h{h}", "port": "p0", "link": f"h{h}p0-leaf{l}"} for h in (2 * l, 2 * l + 1)],
                "uplinks": [{"spine": f"spine{s}", "link": f"leaf{l}-spine{s}"} for s in range(2)]}
               for l in range(2)],
    "spines": [{"name": f"spine{s}", "index": s, "netns": f"nl-ls4-spine{s}",
                "downlinks": [{"leaf": f"leaf{l}", "link": f"leaf{l}-spine{s}"} for l in range(2)]}
               for s in range(2)],
    "links": [{"name": f"h{h}p0-leaf{h // 2}", "kind": "host", "a": f"h{h}", "b": f"leaf{h // 2}",
               "rate_bps": 1000000000} for h in range(4)]
             + [{"name": f"leaf{l}-spine{s}", "kind": "uplink", "a": f"leaf{l}", "b": f"spine{s}",
                 "rate_bps": 1000000000} for l in range(2) for s in range(2)],
}


def fnv1a64(data):
    """The topology hash of libc4comm/planner/topology.cc: FNV-1a 64 over the file's bytes with its
    offset 1469598103934665603 (not FNV's usual 14695981039346656037) and prime 1099511628211."""
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) % (1 << 64)
    return h


def test_leafspine_file(tmp_path):
    """4 hosts, 2 per leaf, 2 spines, all links equal, K=1. Cut-through: every chunk, same-leaf or
    cross-leaf, arrives one period after it starts, so each host's 3 receipts over its one downlink
    give E >= 3. E = 3 is met with every host link busy at 0, 1, 2: epoch 0 the leaf pairs swap
    (h0 <-> h1, h2 <-> h3), epoch 1 h0 -> h2 c0, h1 -> h3 c1, h2 -> h0 c2, h3 -> h1 c3 (two transfers
    per leaf and direction, one per spine), epoch 2 the leaf pairs swap what they got across
    (h1 -> h0 c3, h0 -> h1 c2, h2 -> h3 c0, h3 -> h2 c1).
    (Store-and-forward model before: a same-leaf chunk took 2 epochs, a cross-leaf one 4, E = 6.)"""
    path = tmp_path / "ls4.json"
    path.write_text(json.dumps(LEAF_SPINE, indent=1))
    doc, _ = synth(tmp_path, "allgather", "--topo", str(path), name="ls")
    assert doc["info"]["allgather_epochs"] == 3
    assert doc["info"]["makespan_proven_optimal"] is True
    assert doc["topology"] == {"hash": f"0x{fnv1a64(path.read_bytes()):016x}", "hosts": ["h0", "h1", "h2", "h3"]}
    # 1 Gbit/s links: an epoch of 1 MiB is 8.39 ms.
    assert doc["info"]["tau_s"] == pytest.approx((1 << 20) * 8 / 1e9)
    assert doc["info"]["predicted_time_s"] == pytest.approx(3 * (1 << 20) * 8 / 1e9)
    rs, _ = synth(tmp_path, "reducescatter", "--topo", str(path), name="ls")
    ar, _ = synth(tmp_path, "allreduce", "--topo", str(path), name="ls")
    assert rs["info"]["epochs"] == 3 and ar["info"]["epochs"] == 6
    assert rs["topology"] == ar["topology"] == doc["topology"]
    # ReduceScatter is the AllGather reversed: the same transfers in the other direction.
    ag_pairs = sorted((s["peer"], r, s["chunk"]) for r, rk in enumerate(doc["ranks"]) for s in rk["steps"]
                      if s["op"] == "recv")
    rs_pairs = sorted((r, s["peer"], s["chunk"]) for r, rk in enumerate(rs["ranks"]) for s in rk["steps"]
                      if s["op"] == "recv-reduce")
    assert ag_pairs == rs_pairs


@pytest.mark.parametrize("gen,chunks", [("line:3", 2), ("ring:4", 2), ("star:4", 1), ("dgx1", 2),
                                        ("leafspine:8,2,2", 1)])
def test_derived_collectives(tmp_path, gen, chunks):
    """ReduceScatter (reversed AllGather) and AllReduce (ReduceScatter + AllGather) files pass the
    checker: every non-owner sends each partial exactly once after the partials of its children,
    every owner ends with all contributions exactly once, every rank with every final value."""
    ag, _ = synth(tmp_path, "allgather", "--gen", gen, "--chunks", str(chunks), *MILP)
    rs, _ = synth(tmp_path, "reducescatter", "--gen", gen, "--chunks", str(chunks), *MILP)
    ar, _ = synth(tmp_path, "allreduce", "--gen", gen, "--chunks", str(chunks), *MILP)
    e = ag["info"]["allgather_epochs"]
    assert rs["info"]["epochs"] == e and ar["info"]["epochs"] == 2 * e
    n = ag["nranks"]
    # Every non-owner sends exactly one partial of every chunk of the other blocks.
    for r, rk in enumerate(rs["ranks"]):
        partials = sorted(s["chunk"] for s in rk["steps"] if s["op"] == "send-partial")
        assert partials == [c for c in range(n * chunks) if c // chunks != r]


def test_time_partitioning(tmp_path):
    """Rounds of 2 epochs on the 8-host leaf-spine (optimum 7 epochs = the ingress bound: 7 receipts
    per host over one downlink, each one period after its start; store-and-forward before: 9): a
    valid schedule, no better than the optimum; the greedy scheduler alone is valid too."""
    doc, _ = synth(tmp_path, "allreduce", "--gen", "leafspine:8,2,2", "--round-epochs", "2")
    assert doc["info"]["allgather_epochs"] >= 7
    assert doc["info"]["mode"].startswith("time partitioning")
    g, _ = synth(tmp_path, "allgather", "--gen", "leafspine:8,2,2", "--solver", "greedy", name="greedy")
    assert g["info"]["method"] == "greedy" and g["info"]["allgather_epochs"] >= 7


def test_bad_inputs(tmp_path):
    p = run_tool("--gen", "line:3", "--coll", "broadcast", "--out", str(tmp_path / "x.json"), expect=EXIT_USAGE)
    assert "--coll 'broadcast'" in p.stderr and "alltoall" in p.stderr
    bad = copy.deepcopy(LEAF_SPINE)
    del bad["hosts"][3]  # leaf1 still lists h3
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    p = run_tool("--topo", str(path), "--coll", "allgather", "--out", str(tmp_path / "x.json"), expect=EXIT_USAGE)
    assert 'names host "h3", which is not in hosts' in p.stderr
    p = run_tool("--topo", str(tmp_path / "none.json"), "--coll", "allgather", "--out", str(tmp_path / "x.json"),
                 expect=EXIT_USAGE)
    assert "cannot be read" in p.stderr
    p = run_tool("--gen", "torus:4", "--coll", "allgather", "--out", str(tmp_path / "x.json"), expect=EXIT_USAGE)
    assert "unknown fabric" in p.stderr
    p = run_tool("--gen", "line:3", "--rate", "nope*=10", "--coll", "allgather", "--out", str(tmp_path / "x.json"),
                 expect=EXIT_USAGE)
    assert "no cable" in p.stderr
    assert not (tmp_path / "x.json").exists()


def test_no_schedule_exit_code(tmp_path):
    """Exit 3 (fall back to the generated algorithms) when no schedule is found: a time limit too
    small for any solution, a horizon below the lower bound, a horizon the solver proves infeasible
    (the 4-host leaf-spine needs 6 epochs, see test_leafspine_file)."""
    out = str(tmp_path / "x.json")
    p = run_tool("--gen", "leafspine:8,2,2", "--coll", "allgather", "--out", out, "--round-epochs", "0",
                 "--no-warm-start", "--time-limit", "0.001", expect=EXIT_NO_SCHEDULE)
    assert "no schedule" in p.stderr
    p = run_tool("--gen", "line:3", "--coll", "allgather", "--out", out, "--epochs", "1", *MILP,
                 expect=EXIT_NO_SCHEDULE)
    assert "below the lower bound" in p.stderr
    p = run_tool("--gen", "leafspine:4,2,1", "--rate", "leaf*-spine*=25", "--coll", "allgather", "--out", out,
                 "--epochs", "8", expect=EXIT_NO_SCHEDULE)
    assert "no schedule" in p.stderr
    assert not os.path.exists(out)


def test_write_mps(tmp_path):
    mps = str(tmp_path / "m.mps")
    run_tool("--gen", "ring:4", "--coll", "allgather", "--write-mps", mps, "--mps-only")
    text = open(mps).read()
    assert "MARKER" in text and "ENDATA" in text
    meta = json.load(open(mps + ".json"))
    assert meta["lower_bound"] == 2 and meta["full"] is True


def test_checker_catches_errors(tmp_path):
    ag, out = synth(tmp_path, "allgather", "--gen", "ring:4", *MILP)
    ar, _ = synth(tmp_path, "allreduce", "--gen", "ring:4", *MILP)

    def bad(doc, change, text):
        d = copy.deepcopy(doc)
        change(d)
        with pytest.raises(synth_check.ScheduleError, match=text):
            synth_check.check(d)

    steps = lambda d, r: d["ranks"][r]["steps"]  # noqa: E731
    bad(ag, lambda d: steps(d, 0).reverse(), "does not hold|message")
    bad(ag, lambda d: steps(d, 1).pop(), "ends without|receives")
    bad(ag, lambda d: steps(d, 2)[0].update(peer=2), "peer 2")
    bad(ag, lambda d: steps(d, 2)[0].update(op="send-partial"), "op 'send-partial'")
    bad(ag, lambda d: d.update(version=2), "version")
    bad(ag, lambda d: d.update(nranks=5), "ranks")
    bad(ag, lambda d: (steps(d, 3)[0].update(deps=[1]), steps(d, 3)[1].update(deps=[0])), "dependency cycle")
    # A recv-reduce moved after the partial of that chunk left.
    def late_reduce(d):
        s = steps(d, 0)
        i = next(i for i, x in enumerate(s) if x["op"] == "recv-reduce")
        j = next(j for j, x in enumerate(s) if x["op"] == "send-partial" and x["chunk"] == s[i]["chunk"]) \
            if any(x["op"] == "send-partial" and x["chunk"] == s[i]["chunk"] for x in s) else None
        if j is None:  # rank 0 owns that chunk: drop one of its reductions instead
            s.pop(i)
        else:
            s.insert(j + 1, s.pop(i))
    bad(ar, late_reduce, "after its partial left|message|ends|reduced over")
    # A deadlock that every per-rank check accepts: ranks 0 and 1 each wait for chunk 2 from the other.
    dl = {"format": "c4comm-schedule", "version": 1, "name": "dl", "collective": "allgather", "nranks": 3,
          "chunks": 1, "ranks": [
              {"steps": [{"op": "recv", "peer": 1, "chunk": 2}, {"op": "send", "peer": 1, "chunk": 2},
                         {"op": "send", "peer": 2, "chunk": 0}, {"op": "recv", "peer": 2, "chunk": 1}]},
              {"steps": [{"op": "recv", "peer": 0, "chunk": 2}, {"op": "send", "peer": 0, "chunk": 2},
                         {"op": "send", "peer": 2, "chunk": 1}, {"op": "recv", "peer": 2, "chunk": 0}]},
              {"steps": [{"op": "recv", "peer": 0, "chunk": 0}, {"op": "recv", "peer": 1, "chunk": 1},
                         {"op": "send", "peer": 0, "chunk": 1}, {"op": "send", "peer": 1, "chunk": 0}]}]}
    with pytest.raises(synth_check.ScheduleError, match="deadlock"):
        synth_check.check(dl)
    # The command line: exit 1 on a bad file, 0 on a good one.
    broken = tmp_path / "broken.json"
    d = copy.deepcopy(ag)
    steps(d, 1).pop()
    broken.write_text(json.dumps(d))
    run_tool("--check", out)
    p = run_tool("--check", str(broken), expect=1)
    assert "FAIL" in p.stderr


# -- AllToAll ------------------------------------------------------------------------------------------
def alltoall(tmp_path, *args, name="a2a"):
    doc, out = synth(tmp_path, "alltoall", *args, name=name)
    return doc["info"]["epochs"], doc


def a2a_transfers(*argv):
    """(topology, transfers, bound, report) of an AllToAll synthesized in this process."""
    args = c4_synth.build_parser().parse_args(["--quiet", "--out", "unused.json", "--coll", "alltoall", *argv])
    return c4_synth.run_alltoall(args)


def test_alltoall_star3(tmp_path):
    """3 hosts on one switch: each host sends 2 blocks and receives 2 over its one cable, K chunks
    each: E >= 2K (egress and ingress), and the direct schedule meets it (at epoch t every host sends
    to the next one, then to the one after): K=1: 2, K=2: 4; nothing relayed."""
    for K, E in ((1, 2), (2, 4)):
        e, doc = alltoall(tmp_path, "--gen", "star:3", "--chunks", str(K), *MILP)
        assert e == E and doc["info"]["lower_bound_epochs"] == E and doc["info"]["relayed"] == 0
        assert doc["collective"] == "alltoall" and doc["chunks"] == K
        assert doc["info"]["makespan_proven_optimal"] is True


def test_alltoall_line3(tmp_path):
    """h0 - h1 - h2. The outer pair's blocks take two hops through h1 (h1 relays them). Each
    direction of each cable carries 2 blocks: h0 -> h1 carries (0 -> 1) and (0 -> 2), h1 -> h2
    carries (1 -> 2) and the relayed (0 -> 2), and the mirror images: E >= 2K. K=1: E = 2 (epoch 0:
    h0 -> h1 the block for h2, h1 -> h2 its own block; epoch 1: h0 -> h1 its block for h1, h1 -> h2
    the relayed one, arriving at 2). K=2: E = 4 (relayed chunks first). 2K chunks relayed."""
    for K, E in ((1, 2), (2, 4)):
        e, doc = alltoall(tmp_path, "--gen", "line:3", "--chunks", str(K), *MILP)
        assert e == E and doc["info"]["lower_bound_epochs"] == E
        assert doc["info"]["relayed"] == 2 * K
        assert messages(doc)[1] == (4 * K, 4 * K)  # h1: 2K own + 2K relayed sends, 2K + 2K receives


def test_alltoall_unequal_parallel_links(tmp_path):
    """Two hosts, cables of 100 and 25 Gbit/s (periods 1 and 4), K=5 chunks each way: the LP splits
    the block 4:1 (fluid: 1 + 1/4 chunks per epoch, 5 chunks in 4 epochs), whole chunks: 4 on the
    fast cable (arriving at 1..4) and 1 on the slow one (arriving at 4): E = 4 = the egress bound,
    against 5 for the fast cable alone."""
    args = ["--gen", "line:2", "--ports", "2", "--rate", "h0-h1.1=25", "--chunks", "5", *MILP]
    e, doc = alltoall(tmp_path, *args)
    assert e == 4 and doc["info"]["lp_epochs"] == 4 and doc["info"]["lower_bound_epochs"] == 4
    topo, transfers, bound, _ = a2a_transfers(*args)
    use = {}
    for tr in transfers:
        (li, _), = tr.links
        key = (tr.src, topo.links[li].cable)
        use[key] = use.get(key, 0) + 1
    assert use == {(0, "h0-h1"): 4, (0, "h0-h1.1"): 1, (1, "h0-h1"): 4, (1, "h0-h1.1"): 1}


def test_alltoall_slow_uplink_cut(tmp_path):
    """leafspine:4,2,1, host links 100 Gbit/s (period 1), uplinks 25 (period 4), K=1. Leaf0's two
    hosts send 2 x 2 = 4 blocks to leaf1 over one uplink, each a class-4 transfer that takes the
    whole uplink for 4 epochs: the cut bound is 16, met with the uplink busy back to back (arrivals
    at 4, 8, 12, 16) and the same-leaf blocks in between; the host-link bounds are only 3."""
    e, doc = alltoall(tmp_path, "--gen", "leafspine:4,2,1", "--rate", "leaf*-spine*=25", *MILP)
    lbs = doc["info"]["lower_bounds"]
    assert e == 16 and doc["info"]["lower_bound_epochs"] == 16 and lbs["cut"] == 16
    assert lbs["egress"] == 3 and lbs["ingress"] == 3


@pytest.mark.parametrize("gen,chunks", [("dgx1", 1), ("dgx1", 2), ("leafspine:8,2,2", 1), ("ring:5", 2)])
def test_alltoall_fabrics(tmp_path, gen, chunks):
    """LP schedules on larger fabrics: valid files, between the lower bound and the direct schedule;
    on DGX-1 the non-neighbours' blocks are relayed (no NVLink joins them) and the LP beats the
    direct schedule (fewest-latency chains)."""
    e, doc = alltoall(tmp_path, "--gen", gen, "--chunks", str(chunks), *MILP)
    d, ddoc = alltoall(tmp_path, "--gen", gen, "--chunks", str(chunks), "--solver", "greedy", name="direct")
    assert ddoc["info"]["method"] == "direct"
    assert doc["info"]["lower_bound_epochs"] <= e <= d
    assert doc["info"]["lp_epochs"] <= e
    if gen == "dgx1":
        assert doc["info"]["relayed"] > 0 and e < d


def test_alltoall_exit_codes(tmp_path):
    out = str(tmp_path / "x.json")
    p = run_tool("--gen", "line:3", "--coll", "alltoall", "--out", out, "--epochs", "1", *MILP, expect=EXIT_NO_SCHEDULE)
    assert "below the lower bound" in p.stderr
    # DGX-1, K=1: the bound is 2, the LP needs 3 (see the docs): 2 is proven infeasible.
    p = run_tool("--gen", "dgx1", "--coll", "alltoall", "--out", out, "--epochs", "2", expect=EXIT_NO_SCHEDULE)
    assert "no AllToAll LP solution" in p.stderr
    assert not os.path.exists(out)
    p = run_tool("--gen", "line:3", "--coll", "alltoall", "--out", out, "--round-epochs", "4", expect=EXIT_USAGE)


def test_checker_alltoall(tmp_path):
    doc, out = synth(tmp_path, "alltoall", "--gen", "line:3", *MILP)

    def bad(change, text):
        d = copy.deepcopy(doc)
        change(d)
        with pytest.raises(synth_check.ScheduleError, match=text):
            synth_check.check(d)

    steps = lambda d, r: d["ranks"][r]["steps"]  # noqa: E731
    # n = 3, K = 1: chunk c = block = s * 3 + d; rank 0's input: chunks 1, 2; its output: 3, 6.
    bad(lambda d: steps(d, 0).append({"op": "recv", "peer": 1, "chunk": 1}), "its own input")
    bad(lambda d: steps(d, 0).append({"op": "send", "peer": 1, "chunk": 4}), "copied locally")
    bad(lambda d: steps(d, 0).append({"op": "send", "peer": 1, "chunk": 5}), "does not hold")
    bad(lambda d: d["ranks"][0].update(steps=[s for s in steps(d, 0) if s["op"] == "send"]), "ends without|receives")
    bad(lambda d: steps(d, 0).append({"op": "send-partial", "peer": 1, "chunk": 1}), "op 'send-partial'")
    bad(lambda d: steps(d, 0).append({"op": "send", "peer": 1, "chunk": 9}), "out of range")
    # The relay h1 forwarding the block 0 -> 2 before receiving it: no longer held.
    def early_relay(d):
        s = steps(d, 1)
        i = next(i for i, x in enumerate(s) if x["op"] == "recv" and x["chunk"] == 2)
        j = next(j for j, x in enumerate(s) if x["op"] == "send" and x["chunk"] == 2)
        s.insert(i, s.pop(j))
    bad(early_relay, "does not hold")
