"""Schedule files (docs/schedules.md) from AllGather transfers: AllGather itself, ReduceScatter (the
AllGather reversed in time with every transfer reversed) and AllReduce (that ReduceScatter, then the
AllGather). Pure Python standard library."""

from __future__ import annotations

import json
import re

from synth_core import Transfer

NAME_RE = re.compile(r"[A-Za-z0-9_.+-]{1,48}")
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")


def reverse(transfers, makespan: int, topo=None) -> list:
    """The ReduceScatter of an AllGather: transfer (a -> b, start s, arrival e, class q) becomes
    b -> a from makespan - e to makespan - s, over the reverse links of its path in reverse order
    (same cables, same rates, same class), link j of the reversed path starting at makespan - e +
    j*alpha. Each link's occupancy is the forward one mirrored in time and shifted by -alpha, so the
    reversed transfers fit wherever the forward ones did. Every chunk's broadcast tree becomes a
    reduction tree: a rank sends its partial up once, after the partials of its children arrived.
    Without `topo` the link ids stay the forward ones (only used as a tie-break)."""
    out = []
    for tr in transfers:
        start = makespan - tr.arrive
        if topo is None:
            links = tuple(reversed(tr.links))
        else:
            a = topo.alpha
            links = tuple((topo.links[li].reverse, start + j * a) for j, (li, _) in enumerate(reversed(tr.links)))
        out.append(Transfer(tr.dst, tr.src, tr.chunk, start, makespan - tr.start, links, tr.rate))
    return out


def shift(transfers, epochs: int) -> list:
    return [Transfer(t.src, t.dst, t.chunk, t.start + epochs, t.arrive + epochs,
                     tuple((li, k + epochs) for li, k in t.links), t.rate) for t in transfers]


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
                 topology=None, info=None, topo=None) -> dict:
    """The schedule file object for `coll` from an AllGather's transfers (alltoall: from the
    AllToAll's transfers, relays included)."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"schedule name \"{name}\": 1-48 of [A-Za-z0-9_.+-]")
    if coll in ("allgather", "alltoall"):  # alltoall: its own transfers (synth_a2a), chunk ids per block
        phases = [(transfers, "send", "recv")]
    elif coll == "reducescatter":
        phases = [(reverse(transfers, makespan, topo), "send-partial", "recv-reduce")]
    elif coll == "allreduce":
        phases = [(reverse(transfers, makespan, topo), "send-partial", "recv-reduce"),
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
