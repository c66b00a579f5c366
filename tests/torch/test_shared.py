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


STEPS = 20


def _ddp_shared(ctx):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import c4comm_torch

    def train(group, shared):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                    torch.nn.ReLU(), torch.nn.Linear(64, 8))
        gen = torch.Generator().manual_seed(1000 + ctx.rank)
        opt = None
        ddp = None

        def step():
            x = torch.randn(16, 32, generator=gen)
            y = torch.randn(16, 8, generator=gen)
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()

        if shared:
            # DDP's buckets (made at construction, and rebuilt once at the second step) in
            # shareable memory; the gradients are views of them.
            with c4comm_torch.shared_allocations(min_bytes=4096):
                ddp = DDP(model, process_group=group, gradient_as_bucket_view=True)
                opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
                step()
                step()
            done = 2
        else:
            ddp = DDP(model, process_group=group)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
            done = 0
        for _ in range(STEPS - done):
            step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    errs = []
    ref = train(ctx.gloo, False)
    got = train(ctx.c4, True)
    everyone = [torch.empty_like(got) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, got, group=ctx.gloo)
    for r, p in enumerate(everyone):
        if not torch.equal(p, got):
            errs.append("rank %d's parameters differ from rank %d's" % (r, ctx.rank))
    if not torch.allclose(got, ref, rtol=1e-4, atol=1e-5):
        errs.append("c4 (shared buckets) vs gloo: max abs diff %g" % (got - ref).abs().max().item())
    return errs


def test_ddp_with_buckets_in_shared_memory_runs_zero_copy_and_matches_gloo():
    with tempfile.TemporaryDirectory(prefix="c4torch-ddp-shared-") as d:
        run_ranks(_ddp_shared, 2, timeout=300, env={"C4_TRACE_DIR": d, "C4_TRACE": "op"})
        files = [f for f in (fmt.TraceFile(p) for p in fmt.find_files(d)) if "p2p" not in f.name]
        assert len(files) == 2, [f.path for f in files]
        for f in files:
            algos = [fmt.ALGOS.get(e[9], e[9]) for e in f.events() if e[5] == fmt.T_OP]
            # Every step after the bucket rebuild reduces its (one) bucket zero-copy.
            assert algos.count("zerocopy") >= STEPS - 2, (f.rank, algos)
