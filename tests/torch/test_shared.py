"""Tensors on shareable memory (c4comm_torch.empty): backend c4 runs their collectives zero-copy
(the trace says so), with the same results as on ordinary tensors."""

import os
import sys
import tempfile

from harness import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "c4-trace"))
from c4trace import fmt  # noqa: E402

N = 70001  # above the one-shot limit, not a multiple of anything


def _ops(ctx):
    import torch
    import torch.distributed as dist

    import c4comm_torch

    g, r, w = ctx.c4, ctx.rank, ctx.world_size
    errs = []
    t = c4comm_torch.empty(N, dtype=torch.float32)
    if t.shape != (N,) or t.dtype != torch.float32 or t.abs().sum().item() != 0:
        errs.append("empty: %s %s, sum %s" % (tuple(t.shape), t.dtype, t.abs().sum().item()))
    base = torch.arange(N, dtype=torch.float32) % 97
    t.copy_(base * (r + 1))
    dist.all_reduce(t, group=g)
    if not torch.equal(t, base * (w * (w + 1) / 2)):
        errs.append("all_reduce on shared memory differs")
    m = c4comm_torch.empty(3, 1000, dtype=torch.int64)
    m.fill_(r)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=g)
    if m.shape != (3, 1000) or int(m.min()) != w - 1:
        errs.append("2-D int64 max: %s %s" % (tuple(m.shape), int(m.min())))
    out = c4comm_torch.empty(w * N, dtype=torch.float32)
    dist._all_gather_base(out, base + r, group=g)  # the input is ordinary memory: messages
    for k in range(w):
        if not torch.equal(out[k * N:(k + 1) * N], base + k):
            errs.append("_all_gather_base block %d" % k)
    return errs


def test_shared_tensors_run_zero_copy_with_the_same_results():
    with tempfile.TemporaryDirectory(prefix="c4torch-shared-") as d:
        run_ranks(_ops, 2, env={"C4_TRACE_DIR": d, "C4_TRACE": "op"})
        files = [f for f in (fmt.TraceFile(p) for p in fmt.find_files(d)) if "p2p" not in f.name]
        assert len(files) == 2, [f.path for f in files]
        for f in files:
            ops = [e for e in f.events() if e[5] == fmt.T_OP]
            algos = [fmt.ALGOS.get(e[9], e[9]) for e in ops]
            # Both all_reduces on shared tensors went zero-copy; the all-gather from an ordinary
            # input did not.
            assert algos.count("zerocopy") == 2, (f.rank, algos)
            assert len(ops) == 3, (f.rank, algos)
