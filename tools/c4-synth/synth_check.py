#!/usr/bin/env python3
"""A checker of schedule files (docs/schedules.md), independent of the C++ loader: pure Python.

check(doc) raises ScheduleError naming the rank and step on:
  - structure: format, version, name, collective, counts, ranks, keys, ops the collective does not
    use, peers and chunks out of range, bad or cyclic "deps";
  - data, per rank in list order: a send of a chunk the rank does not hold, a chunk received twice,
    a partial sent twice or for the rank's own block, a recv-reduce after the chunk's partial left,
    a final value sent by its owner before its last recv-reduce, a rank ending without its data;
  - matching: the k-th message from A to B against the k-th B receives from A (same chunk, send with
    recv, send-partial with recv-reduce, equal counts);
  - execution: all ranks run symbolically with the executor's rules (a step waits for its explicit
    deps and for the steps its data comes from; steps with one peer are posted in order; a message
    moves when both ends are posted): a deadlock is an error, and every value is tracked as the set
    of ranks whose input it contains: a contribution reduced twice, a final value sent incomplete,
    an owner ending without all nranks contributions exactly once, a rank ending without every
    chunk's final value are errors.
AllToAll files (collective "alltoall"): nranks * nranks blocks, block b = s * nranks + d is what
rank s sends to rank d, chunk c is part c % chunks of block c // chunks; only send and recv; rank r
starts with every chunk of its blocks r * nranks + d (d != r), the block r * nranks + r is copied
locally and never appears; a rank may receive a chunk for another rank and send it on (relay); it
sends only chunks it holds (its input, or received before in list order), never receives a chunk it
holds or one of its own input, and ends with every chunk of every block s * nranks + r (s != r).
Command line: synth_check.py FILE... (exit 0 when all pass, 1 otherwise; c4-synth --check does
the same).
"""

from __future__ import annotations

import json
import re
import sys

NAME_RE = re.compile(r"[A-Za-z0-9_.+-]{1,48}")
OPS = {"allgather": ("send", "recv"), "reducescatter": ("send-partial", "recv-reduce"),
       "allreduce": ("send", "recv", "send-partial", "recv-reduce"), "alltoall": ("send", "recv")}
SEND_OPS = ("send", "send-partial")
MATCH = {"send": "recv", "send-partial": "recv-reduce"}
TOP_KEYS = {"format", "version", "name", "collective", "nranks", "chunks", "topology", "info", "ranks"}
STEP_KEYS = {"op", "peer", "chunk", "deps"}


class ScheduleError(Exception):
    """A schedule that breaks the format or the collective's contract."""


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check(doc, source: str = "schedule") -> dict:
    """Checks a parsed schedule file; returns statistics {"steps", "messages", "depth"} (depth: the
    longest chain of messages, each waiting for the one before). Raises ScheduleError."""
    def fail(msg):
        raise ScheduleError(f"{source}: {msg}")

    if not isinstance(doc, dict):
        fail("not a JSON object")
    extra = set(doc) - TOP_KEYS
    if extra:
        fail(f"unknown key(s) {', '.join(sorted(extra))}")
    if doc.get("format") != "c4comm-schedule":
        fail(f"format {doc.get('format')!r}, expected \"c4comm-schedule\"")
    if doc.get("version") != 1 or not _int(doc.get("version")):
        fail(f"version {doc.get('version')!r}; version 1 expected")
    name = doc.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        fail(f"name {name!r}: 1-48 of [A-Za-z0-9_.+-]")
    coll = doc.get("collective")
    if coll not in OPS:
        fail(f"collective {coll!r}: allgather, reducescatter, allreduce or alltoall")
    n = doc.get("nranks")
    if not _int(n) or not 1 <= n <= 65536:
        fail(f"nranks {n!r} (1-65536)")
    K = doc.get("chunks")
    if not _int(K) or not 1 <= K <= 1024:
        fail(f"chunks {K!r} (1-1024)")
    topo = doc.get("topology")
    if topo is not None:
        if not isinstance(topo, dict) or set(topo) - {"hash", "hosts"}:
            fail("topology: an object with \"hash\" and \"hosts\"")
        h = topo.get("hash")
        if h is not None and not (isinstance(h, str) and re.fullmatch(r"0x[0-9a-fA-F]{16}", h)):
            fail(f"topology hash {h!r}: 0x and 16 hex digits")
        hosts = topo.get("hosts")
        if hosts is not None and not (isinstance(hosts, list) and len(hosts) == n
                                      and all(isinstance(x, str) and x for x in hosts)):
            fail(f"topology hosts: {n} host names expected")
    if "info" in doc and not isinstance(doc["info"], dict):
        fail("info is not an object")
    ranks = doc.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != n:
        fail(f"ranks: an array of nranks = {n} entries expected")
    C = n * n * K if coll == "alltoall" else n * K
    ops_ok = OPS[coll]
    steps = []
    for r, rk in enumerate(ranks):
        if not isinstance(rk, dict) or set(rk) - {"steps"} or not isinstance(rk.get("steps"), list):
            fail(f"rank {r}: an object with \"steps\" expected")
        lst = rk["steps"]
        for i, s in enumerate(lst):
            where = f"rank {r} step {i}"
            if not isinstance(s, dict):
                fail(f"{where}: not an object")
            if set(s) - STEP_KEYS:
                fail(f"{where}: unknown key(s) {', '.join(sorted(set(s) - STEP_KEYS))}")
            if s.get("op") not in ops_ok:
                fail(f"{where}: op {s.get('op')!r} ({coll} uses {', '.join(ops_ok)})")
            p = s.get("peer")
            if not _int(p) or not 0 <= p < n or p == r:
                fail(f"{where}: peer {p!r} out of range or the rank itself")
            c = s.get("chunk")
            if not _int(c) or not 0 <= c < C:
                fail(f"{where}: chunk {c!r} out of range (0-{C - 1})")
            if coll == "alltoall" and (c // K) // n == (c // K) % n:
                fail(f"{where}: chunk {c} of block {c // K} = {(c // K) // n} * nranks + {(c // K) % n}, which is "
                     f"copied locally and never sent")
            deps = s.get("deps", [])
            if not isinstance(deps, list) or not all(_int(d) and 0 <= d < len(lst) and d != i for d in deps):
                fail(f"{where}: deps {deps!r} name steps that do not exist (or the step itself)")
        _check_cycles(lst, r, fail)
        steps.append(lst)

    # Per rank, in list order: the data each step reads must be there.
    for r, lst in enumerate(steps):
        if coll == "alltoall":
            _check_alltoall_rank(r, lst, n, K, fail)
            continue
        held = set()  # final values held
        sent_partial = set()
        reduced_after_final = set()
        own = set(range(r * K, (r + 1) * K))
        if coll == "allgather":
            held |= own
        for i, s in enumerate(lst):
            op, c, where = s["op"], s["chunk"], f"rank {r} step {i}"
            if op == "send":
                if coll == "allreduce" and c in own:
                    held.add(c)  # the owner's value is final after its recv-reduces (checked below)
                if c not in held:
                    fail(f"{where}: sends chunk {c}, which it does not hold at that point")
            elif op == "recv":
                if c in held or (coll == "allreduce" and c in own):
                    fail(f"{where}: receives chunk {c}, which it already holds")
                held.add(c)
            elif op == "send-partial":
                if c in own:
                    fail(f"{where}: sends a partial of chunk {c} of its own block")
                if c in sent_partial:
                    fail(f"{where}: sends the partial of chunk {c} a second time")
                if c in held:
                    fail(f"{where}: sends the partial of chunk {c} after receiving its final value")
                sent_partial.add(c)
            else:  # recv-reduce
                if c in sent_partial:
                    fail(f"{where}: recv-reduce of chunk {c} after its partial left")
                if c in held:
                    fail(f"{where}: recv-reduce of chunk {c} after its final value was "
                         f"{'sent' if c in own else 'received'}")
                reduced_after_final.add(c)
        if coll in ("allgather", "allreduce"):
            lacking = [c for c in range(C) if c not in held and not (coll == "allreduce" and c in own)]
            if lacking:
                fail(f"rank {r} ends without chunk(s) {_ranges(lacking)}")
        if coll in ("reducescatter", "allreduce"):
            unsent = [c for c in range(C) if c not in own and c not in sent_partial]
            if unsent:
                fail(f"rank {r} never sends its partial of chunk(s) {_ranges(unsent)}")

    # Matching per ordered pair.
    outq = {}
    inq = {}
    for r, lst in enumerate(steps):
        for i, s in enumerate(lst):
            if s["op"] in SEND_OPS:
                outq.setdefault((r, s["peer"]), []).append(i)
            else:
                inq.setdefault((s["peer"], r), []).append(i)
    for pair in sorted(set(outq) | set(inq)):
        a, b = pair
        so, ri = outq.get(pair, []), inq.get(pair, [])
        for k in range(min(len(so), len(ri))):
            x, y = steps[a][so[k]], steps[b][ri[k]]
            if MATCH[x["op"]] != y["op"] or x["chunk"] != y["chunk"]:
                fail(f"rank {a} step {so[k]} ({x['op']} chunk {x['chunk']} to {b}) is message {k} from {a} to "
                     f"{b}, but rank {b} step {ri[k]} receives it as {y['op']} chunk {y['chunk']}")
        if len(so) != len(ri):
            fail(f"rank {a} sends {len(so)} message(s) to rank {b}, which receives {len(ri)} from it")

    return _simulate(steps, coll, n, K, fail)


def a2a_input(r, n, K):
    """The chunks rank r starts with in an AllToAll: its blocks r * n + d, d != r."""
    return {(r * n + d) * K + j for d in range(n) if d != r for j in range(K)}


def a2a_output(r, n, K):
    """The chunks rank r must end with in an AllToAll: the blocks s * n + r, s != r."""
    return {(s * n + r) * K + j for s in range(n) if s != r for j in range(K)}


def _check_alltoall_rank(r, lst, n, K, fail):
    own = a2a_input(r, n, K)
    held = set(own)
    for i, s in enumerate(lst):
        op, c, where = s["op"], s["chunk"], f"rank {r} step {i}"
        if op == "send":
            if c not in held:
                fail(f"{where}: sends chunk {c}, which it does not hold at that point")
        else:
            if c in own:
                fail(f"{where}: receives chunk {c}, a chunk of its own input")
            if c in held:
                fail(f"{where}: receives chunk {c}, which it already holds")
            held.add(c)
    lacking = a2a_output(r, n, K) - held
    if lacking:
        fail(f"rank {r} ends without chunk(s) {_ranges(lacking)}")


def _check_cycles(lst, r, fail):
    state = [0] * len(lst)
    for i0 in range(len(lst)):
        if state[i0]:
            continue
        stack = [(i0, iter(lst[i0].get("deps", [])))]
        state[i0] = 1
        path = [i0]
        while stack:
            i, it = stack[-1]
            d = next(it, None)
            if d is None:
                state[i] = 2
                stack.pop()
                path.pop()
                continue
            if state[d] == 1:
                cyc = path[path.index(d):] + [d]
                fail(f"rank {r} step {d}: dependency cycle {' -> '.join(map(str, cyc))}")
            if state[d] == 0:
                state[d] = 1
                stack.append((d, iter(lst[d].get("deps", []))))
                path.append(d)


def _ranges(xs):
    xs = sorted(xs)
    out = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out[:8]) + (" ..." if len(out) > 8 else "")


def _simulate(steps, coll, n, K, fail) -> dict:
    """Runs every rank's steps symbolically (see the module docstring); returns statistics."""
    full = (1 << n) - 1
    C = n * n * K if coll == "alltoall" else n * K
    # Derived data dependencies: the earlier steps (same rank) whose completion a step waits for.
    waits = []
    for r, lst in enumerate(steps):
        own = range(r * K, (r + 1) * K)
        last_recv = {}
        reduces = {}
        partial_sent = {}
        w = []
        for i, s in enumerate(lst):
            c, op = s["chunk"], s["op"]
            dep = list(s.get("deps", []))
            if op == "send":
                if c in last_recv:
                    dep.append(last_recv[c])
                if c in own:
                    dep += reduces.get(c, [])
            elif op == "send-partial":
                dep += reduces.get(c, [])
                partial_sent[c] = i
            elif op == "recv-reduce":
                dep += reduces.get(c, [])  # writes into the partial are serialized
                reduces.setdefault(c, []).append(i)
            else:  # recv: waits for the read of the partial it overwrites
                if c in partial_sent:
                    dep.append(partial_sent[c])
                last_recv[c] = i
            w.append(dep)
        waits.append(w)

    # Values: allgather: the chunk is there (1); reduction: bitmask of contributing ranks.
    value = [dict() for _ in range(n)]
    for r in range(n):
        if coll == "alltoall":
            own = a2a_input(r, n, K)
        for c in range(C):
            if coll == "allgather":
                value[r][c] = full if c // K == r else 0
            elif coll == "alltoall":
                value[r][c] = full if c in own else 0
            else:
                value[r][c] = 1 << r
    final = [set() for _ in range(n)]  # chunks whose final value rank r holds
    if coll == "allgather":
        for r in range(n):
            final[r] = set(range(r * K, (r + 1) * K))
    elif coll == "alltoall":
        for r in range(n):
            final[r] = a2a_input(r, n, K)
    done = [bytearray(len(lst)) for lst in steps]
    posted = [bytearray(len(lst)) for lst in steps]
    hops = [[0] * len(lst) for lst in steps]  # message depth at completion
    # Per rank and peer: indices of steps with that peer, in order, and how many are posted.
    by_peer = []
    for lst in steps:
        d = {}
        for i, s in enumerate(lst):
            d.setdefault(s["peer"], []).append(i)
        by_peer.append(d)
    next_post = [{p: 0 for p in d} for d in by_peer]
    # Matching queues: posted sends / receives per ordered pair, in order.
    sendq = {}
    recvq = {}
    remaining = sum(len(lst) for lst in steps)
    messages = 0
    depth = 0

    def ready(r, i):
        return all(done[r][d] for d in waits[r][i])

    progress = True
    while progress:
        progress = False
        for r in range(n):
            for p, idx in by_peer[r].items():
                j = next_post[r][p]
                while j < len(idx) and ready(r, idx[j]):
                    i = idx[j]
                    posted[r][i] = 1
                    s = steps[r][i]
                    if s["op"] in SEND_OPS:
                        sendq.setdefault((r, p), []).append(i)
                    else:
                        recvq.setdefault((p, r), []).append(i)
                    j += 1
                    progress = True
                next_post[r][p] = j
        for pair in list(sendq):
            a, b = pair
            sq, rq = sendq[pair], recvq.get(pair, [])
            while sq and rq:
                i, k = sq.pop(0), rq.pop(0)
                s, t = steps[a][i], steps[b][k]
                c = s["chunk"]
                val = value[a][c]
                if s["op"] == "send":
                    if val != full:
                        fail(f"rank {a} step {i}: sends chunk {c} before it is final "
                             f"(it holds contributions of {_bits(val, n)} only)")
                    value[b][c] = full
                    final[b].add(c)
                else:  # send-partial -> recv-reduce
                    if value[b][c] & val:
                        fail(f"rank {b} step {k}: reduces the contribution(s) of rank(s) "
                             f"{_bits(value[b][c] & val, n)} into chunk {c} a second time")
                    value[b][c] |= val
                before = max([hops[a][d] for d in waits[a][i]] + [hops[b][d] for d in waits[b][k]] + [0])
                hops[a][i] = hops[b][k] = before + 1
                depth = max(depth, before + 1)
                done[a][i] = done[b][k] = 1
                remaining -= 2
                messages += 1
                progress = True
    if remaining:
        stuck = []
        for r, lst in enumerate(steps):
            for i, s in enumerate(lst):
                if not done[r][i]:
                    stuck.append(f"rank {r} step {i} ({s['op']} chunk {s['chunk']} "
                                 f"{'to' if s['op'] in SEND_OPS else 'from'} {s['peer']}"
                                 f"{', posted' if posted[r][i] else ''})")
                    break
        fail(f"deadlock: {remaining} step(s) never complete; first waiting: " + "; ".join(stuck[:6]))
    for r in range(n):
        if coll == "alltoall":
            lacking = a2a_output(r, n, K) - final[r]
            if lacking:
                fail(f"rank {r} ends without chunk(s) {_ranges(lacking)}")
            continue
        for c in range(C):
            owner = c // K
            if coll == "reducescatter" and owner == r and value[r][c] != full:
                fail(f"rank {r} ends with chunk {c} reduced over rank(s) {_bits(value[r][c], n)} "
                     f"only (all {n} expected)")
            if coll == "allreduce" and value[r][c] != full:
                fail(f"rank {r} ends without the final value of chunk {c} "
                     f"(contributions of {_bits(value[r][c], n)})")
            if coll == "allgather" and c not in final[r]:
                fail(f"rank {r} ends without chunk {c}")
    return {"steps": sum(len(l) for l in steps), "messages": messages, "depth": depth}


def _bits(x, n):
    return _ranges([i for i in range(n) if x >> i & 1]) or "none"


def check_file(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ScheduleError(f"{path}: cannot be read: {e.strerror}") from None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ScheduleError(f"{path}: not valid JSON ({e})") from None
    return check(doc, path)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: synth_check.py SCHEDULE.json ...  (checks schedule files, docs/schedules.md)")
        return 0 if argv else 2
    rc = 0
    for path in argv:
        try:
            st = check_file(path)
            print(f"{path}: ok ({st['steps']} steps, {st['messages']} messages, depth {st['depth']})")
        except ScheduleError as e:
            print(f"FAIL {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
