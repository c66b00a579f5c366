"""Schedule files (docs/schedules.md) from AllGather transfers: AllGather itself, ReduceScatter (the
AllGather reversed in time with every transfer reversed) and AllReduce (that ReduceScatter, then the
AllGather). Pure Python standard library."""

from __future__ import annotations

import json
import re

from synth_core import Transfer

NAME_RE = re.compile(r"[A-Za-z0-9_.+-]{1,48}")
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def reverse(transfers, makespan: int) -> list:
    """The ReduceScatter of an AllGather: transfer (a -> b, start s, arrival e) becomes b -> a from
    makespan - e to makespan - s on the same links reversed. Every chunk's broadcast tree becomes a
    reduction tree: a rank sends its partial up once, after the partials of its children arrived."""
    out = []
    for tr in transfers:
        links = []
        for li, k in reversed(tr.links):
            links.append((li, k))
        # Link ids stay those of the forward direction (only used as a tie-break).
        out.append(Transfer(tr.dst, tr.src, tr.chunk, makespan - tr.arrive, makespan - tr.start, tuple(links)))
    return out


def shift(transfers, epochs: int) -> list:
    return [Transfer(t.src, t.dst, t.chunk, t.start + epochs, t.arrive + epochs,
                     tuple((li, k + epochs) for li, k in t.links)) for t in transfers]


def rank_steps(nranks: int, phases) -> list:
    """Each rank's steps from [(transfers, send op, recv op)], ordered by the transfers' keys
    (start epoch, arrival, chunk, ends, path): the same order on both ends of every rank pair."""
    items = [[] for _ in range(nranks)]
    for ph, (transfers, send_op, recv_op) in enumerate(phases):
        for tr in transfers:
            k = (ph,) + tr.key()
            items[tr.src].append((k, 0, {"op": send_op, "peer": tr.dst, "chunk": tr.chunk}))
            items[tr.dst].append((k, 1, {"op": recv_op, "peer": tr.src, "chunk": tr.chunk}))
    return [[s for _, _, s in sorted(lst, key=lambda x: (x[0], x[1]))] for lst in items]


def schedule_doc(name: str, coll: str, nranks: int, chunks: int, transfers, makespan: int,
                 topology=None, info=None) -> dict:
    """The schedule file object for `coll` from an AllGather's transfers."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"schedule name \"{name}\": 1-48 of [A-Za-z0-9_.+-]")
    if coll == "allgather":
        phases = [(transfers, "send", "recv")]
    elif coll == "reducescatter":
        phases = [(reverse(transfers, makespan), "send-partial", "recv-reduce")]
    elif coll == "allreduce":
        phases = [(reverse(transfers, makespan), "send-partial", "recv-reduce"),
                  (shift(transfers, makespan), "send", "recv")]
    else:
        raise ValueError(f"collective {coll}: one of {', '.join(COLLECTIVES)}")
    doc = {"format": "c4comm-schedule", "version": 1, "name": name, "collective": coll,
           "nranks": nranks, "chunks": chunks}
    if topology is not None:
        doc["topology"] = topology
    if info is not None:
        doc["info"] = info
    doc["ranks"] = [{"steps": steps} for steps in rank_steps(nranks, phases)]
    return doc


def dumps(doc: dict) -> str:
    """JSON with one line per rank (readable diffs, compact enough for 128 ranks)."""
    head = {k: v for k, v in doc.items() if k != "ranks"}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f" {json.dumps(k)}: {json.dumps(v, sort_keys=False)},")
    lines.append(' "ranks": [')
    ranks = doc.get("ranks", [])
    for i, r in enumerate(ranks):
        lines.append("  " + json.dumps(r, separators=(", ", ": ")) + ("," if i + 1 < len(ranks) else ""))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"
