"""Exports of a merged run: Chrome/Perfetto trace JSON and the merged binary format (.c4m)."""
import json
import struct

from . import analysis, fmt

MERGED_MAGIC = b"C4MERGE\0"
MERGED_HEADER = struct.Struct("<8sIIQ")  # magic, version, record bytes, records
MERGED_RECORD = struct.Struct("<qqQIiiHBBBBBBBxxx")  # t0, t1 (ns, aligned), bytes, seq, peer, rank, comm, type..flags
assert MERGED_RECORD.size == 48


def chrome(run, path):
    """One process per rank (per communicator), thread 0 = operations; at level step one thread per
    (transport lane, peer, direction) plus one for local copies/reductions; with C4P one thread per (peer, lane)
    of lane samples, its plan, re-plans and weight changes as instants on thread 0. Times in us."""
    t_base = min((evs[0][0] for c in run.comms.values() for evs in c.events.values() if evs), default=0)
    n = 0
    with open(path, "w") as f:
        f.write('{"displayTimeUnit":"ns","traceEvents":[\n')
        first = True

        def emit(obj):
            nonlocal first, n
            f.write(("" if first else ",\n") + json.dumps(obj, separators=(",", ":")))
            first = False
            n += 1
        for ci, c in enumerate(run.comms.values()):
            for rank, evs in sorted(c.events.items()):
                pid = ci * 100000 + rank
                label = "rank %d" % rank + ("" if len(run.comms) == 1 else " (%s)" % (c.name or c.tag))
                emit({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
                emit({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
                emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "operations"}})
                named = {0}
                f_ = c.files[rank]
                for e in evs:
                    t0, t1, nbytes, seq, peer, typ, coll, dt, red, algo, via, flags, lane = e
                    ts = (t0 - t_base) / 1000.0
                    dur = max(t1 - t0, 0) / 1000.0
                    if typ == fmt.T_OP and flags & fmt.FLAG_OPEN:
                        # Began and never ended when the file was written: where this rank was.
                        emit({"ph": "i", "s": "p", "name": fmt.coll_name(coll) + " (not ended)", "cat": "open",
                              "pid": pid, "tid": 0, "ts": ts, "args": {"seq": seq, "bytes": nbytes}})
                    elif typ == fmt.T_OP:
                        args = {"seq": seq, "bytes": nbytes, "dtype": fmt.dtype_name(dt),
                                "algo": fmt.ALGOS.get(algo, algo)}
                        if peer >= 0:
                            args["peer" if coll in (8, 9) else "root"] = peer
                        emit({"ph": "X", "name": fmt.coll_name(coll), "cat": "op", "pid": pid, "tid": 0, "ts": ts,
                              "dur": dur, "args": args})
                    elif typ == fmt.T_STEP:
                        kind = fmt.STEPKINDS[red] if red < len(fmt.STEPKINDS) else "step"
                        if peer < 0:
                            tid, tname = 1, "local copy/reduce"
                        else:
                            out = red == 0
                            tid = 10 + via * 1000000 + peer * 2 + (0 if out else 1)
                            tname = "%s %s peer %d" % (f_.transport_name(via), "to" if out else "from", peer)
                        if tid not in named:
                            named.add(tid)
                            emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}})
                        sargs = {"coll": fmt.coll_name(coll), "seq": seq, "bytes": nbytes}
                        if lane >= 0 and peer >= 0:
                            sargs["lane"] = "striped" if lane == fmt.LANE_STRIPED else lane
                        emit({"ph": "X", "name": kind, "cat": "step", "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                              "args": sargs})
                    elif typ == fmt.T_SPAN:
                        if 2 not in named:
                            named.add(2)
                            emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": 2, "args": {"name": "spans"}})
                        emit({"ph": "X", "name": f_.name_of(seq) or "span", "cat": "span", "pid": pid, "tid": 2,
                              "ts": ts, "dur": dur, "args": {"bytes": nbytes}})
                    elif typ == fmt.T_PLAN and red == fmt.PLAN_LANE_SAMPLE:
                        # What one lane sent between two looks of the C4P rebalancer: a slice per (peer, lane).
                        tid = 900000000 + 256 * (max(peer, -1) + 1) + max(lane, 0)  # above the step threads' ids
                        if tid not in named:
                            named.add(tid)
                            emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                  "args": {"name": "C4P lane %d to peer %d" % (lane, peer)}})
                        emit({"ph": "X", "name": "lane sample", "cat": "c4p", "pid": pid, "tid": tid, "ts": ts,
                              "dur": dur, "args": {"bytes": nbytes, "path": f_.name_of(seq),
                                                   "GBps": nbytes / float(t1 - t0) if t1 > t0 else 0.0}})
                    elif typ == fmt.T_PLAN:
                        args = {"text": f_.name_of(seq)}
                        if peer >= 0:
                            args["peer"] = peer
                        if red == fmt.PLAN_REPLAN:
                            args["lane"] = lane
                        emit({"ph": "i", "s": "p", "name": "C4P " + fmt.plan_kind(red), "cat": "c4p", "pid": pid,
                              "tid": 0, "ts": ts, "args": args})
                    else:
                        what = "error" if typ == fmt.T_ERROR else "note"
                        text = f_.name_of(seq)
                        rec = analysis.c4d_from_note(text)[0] if typ == fmt.T_DIAG else None
                        if rec is not None:  # a C4D diagnosis: named after its class, the record as arguments
                            emit({"ph": "i", "s": "g", "name": "C4D " + rec["class"], "cat": "c4d", "pid": pid,
                                  "tid": 0, "ts": ts, "args": rec})
                            continue
                        emit({"ph": "i", "s": "p", "name": what, "cat": what, "pid": pid, "tid": 0, "ts": ts,
                              "args": {"text": text, "code": nbytes}})
        f.write("\n]}\n")
    return n


def merged_binary(run, path):
    """All ranks' events, aligned to rank 0's clock and sorted by begin time, in fixed 48-byte records."""
    recs = []
    for ci, c in enumerate(run.comms.values()):
        for rank, evs in c.events.items():
            for e in evs:
                recs.append((e[0], e[1], e[2], e[3], e[4], rank, ci) + e[5:12])
    recs.sort(key=lambda r: r[0])
    with open(path, "wb") as f:
        f.write(MERGED_HEADER.pack(MERGED_MAGIC, 1, MERGED_RECORD.size, len(recs)))
        pack = MERGED_RECORD.pack
        f.write(b"".join(pack(*r) for r in recs))
    return len(recs)
