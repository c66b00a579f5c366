"""DDP training over backend c4: identical parameters on all ranks, and gloo's result within tolerance.

Tolerance: c4comm and gloo may sum the ranks' gradients in different orders, so float32 results
can differ by rounding; after 20 SGD steps of this small model we allow rtol 1e-4, atol 1e-5.
"""

import pytest

from harness import run_ranks

STEPS = 20
RTOL, ATOL = 1e-4, 1e-5


def _train(group, rank, hook):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.01)  # several buckets
    if hook:
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)  # different data on each rank
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _ddp(ctx, hook):
    import torch
    import torch.distributed as dist

    failures = []
    ref = _train(ctx.gloo, ctx.rank, hook=False)
    got = _train(ctx.c4, ctx.rank, hook=hook)
    everyone = [torch.empty_like(got) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, got, group=ctx.gloo)
    for r, p in enumerate(everyone):
        if not torch.equal(p, got):
            failures.append("rank %d's parameters differ from rank %d's (max diff %g)" %
                            (r, ctx.rank, (p - got).abs().max().item()))
    if not torch.allclose(got, ref, rtol=RTOL, atol=ATOL):
        failures.append("c4 vs gloo: max abs diff %g" % (got - ref).abs().max().item())
    if torch.equal(got, _train_initial()):
        failures.append("parameters did not change")
    return failures


def _train_initial():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _ddp_plain(ctx):
    return _ddp(ctx, hook=False)


def _ddp_hook(ctx):
    return _ddp(ctx, hook=True)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_matches_gloo(world_size):
    run_ranks(_ddp_plain, world_size, timeout=300)


def test_ddp_with_python_comm_hook():
    run_ranks(_ddp_hook, 2, timeout=300)
