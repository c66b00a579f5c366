"""c4comm's tracer gets PyTorch's op names: each operation of backend c4 is a span named after it,
around the c4 operations it ran, in the communicator's trace file (read with tools/c4-trace)."""

import os
import sys
import tempfile

from harness import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "c4-trace"))
from c4trace import fmt  # noqa: E402


def _ops(ctx):
    import torch
    import torch.distributed as dist

    g = ctx.c4
    n = 5003  # above the one-shot limit: the schedule path runs (and has its own op events)
    x = torch.ones(n)
    dist.all_reduce(x, group=g)
    dist.all_reduce(torch.ones(3), group=g)
    dist.all_reduce(x, group=g, async_op=True).wait()
    out = torch.empty(n * ctx.world_size)
    dist._all_gather_base(out, x, group=g)
    dist.broadcast(x, 1, group=g)
    dist.barrier(group=g)
    if ctx.rank == 0:
        dist.send(torch.ones(7, dtype=torch.int64), 1, group=g)
    else:
        dist.recv(torch.empty(7, dtype=torch.int64), 0, group=g)
    return []


def test_spans_carry_pytorch_op_names_around_their_c4_operations():
    with tempfile.TemporaryDirectory(prefix="c4torch-trace-") as d:
        run_ranks(_ops, 2, env={"C4_TRACE_DIR": d, "C4_TRACE": "op"})
        files = [fmt.TraceFile(p) for p in fmt.find_files(d)]
        assert files, "no trace file in C4_TRACE_DIR"
        spans = {}  # (is p2p, rank) -> {name: [bytes, ...]}
        for f in files:
            evs = f.events()
            sp = [e for e in evs if e[5] == fmt.T_SPAN]
            ops = [e for e in evs if e[5] == fmt.T_OP]
            key = ("p2p" in f.name, f.rank)
            names = spans.setdefault(key, {})
            for e in sp:
                names.setdefault(f.name_of(e[3]), []).append(e[2])
            for e in ops:  # every c4 operation ran inside the span of the PyTorch call it served
                inside = [s for s in sp if s[0] - 1 <= e[0] and e[1] <= s[1] + 1]
                assert len(inside) == 1, "%s rank %d: %s op at %d lies in %d spans" % (
                    f.name, f.rank, fmt.coll_name(e[6]), e[0], len(inside))
        for r in (0, 1):
            got = spans.get((False, r))
            assert got is not None, "no trace of rank %d's c4 group (files: %s)" % (r, [f.path for f in files])
            assert sorted(got) == ["_allgather_base", "allreduce", "barrier", "broadcast"], got
            assert got["allreduce"] == [5003 * 4, 3 * 4, 5003 * 4], got  # bytes: the outputs' size
            assert got["_allgather_base"] == [2 * 5003 * 4] and got["barrier"] == [0], got
        assert spans.get((True, 0)) == {"send": [56]}, spans
        assert spans.get((True, 1)) == {"recv": [56]}, spans
