#!/usr/bin/env python3
"""Backend c4 (c4comm_torch) on CUDA tensors: every collective, ordered on the current stream as
backend nccl orders them (GPU; scripts/gpu-check.sh runs it with the backend built for the GPU
host's torch by scripts/gpu-torch-backend.sh).

Each check makes its input with a kernel right before the call and uses the result in a kernel right
after it, with no synchronization in between: only the stream order makes the result right. Every
check runs twice, the second time inside `torch.cuda.stream(side)`, so the backend must follow the
*current* stream, not the default one. Asynchronous calls are waited with work.wait() (which makes
the current stream wait, not the host) and through their Future.

  c4_cuda_collectives.py --world 2               # ranks share GPU 0
  c4_cuda_collectives.py --world 3 --device cpu  # the same checks on CPU tensors (no GPU needed)
"""
import argparse
import contextlib
import os
import sys


def checks(rank, world, dev, fails):
    import torch
    import torch.distributed as dist

    n = (1 << 20) + 7

    def expect(name, got, want):
        got, want = got.cpu(), want.cpu()
        if got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero()
            where = bad[0].tolist() if bad.numel() else "shape"
            fails.append(f"rank {rank}: {name}: wrong at {where} (got {got.flatten()[:4].tolist()}, "
                         f"want {want.flatten()[:4].tolist()})")

    total = sum(r + 1 for r in range(world))
    base = torch.arange(n, dtype=torch.float32)

    # all_reduce, blocking call then a kernel on its result.
    x = torch.arange(n, device=dev, dtype=torch.float32)
    x.mul_(rank + 1)
    dist.all_reduce(x)
    expect("all_reduce", x * 2, base * total * 2)

    # all_reduce asynchronous, work.wait(), several dtypes and ops.
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8):
        x = torch.full((n,), rank + 1, device=dev, dtype=dt)
        x.add_(0)
        w = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
        w.wait()
        expect(f"all_reduce max {dt}", x + 0, torch.full((n,), world, dtype=dt))
    x = torch.full((n,), float(rank + 1), device=dev)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    expect("all_reduce avg", x, torch.full((n,), total / world))

    # The Future: a then() callback and value() see the result.
    x = torch.full((4096,), float(rank + 1), device=dev)
    fut = dist.all_reduce(x, async_op=True).get_future()
    y = fut.then(lambda f: f.value()[0] * 3).wait()
    expect("all_reduce future", y, torch.full((4096,), float(total * 3)))

    # broadcast from the last rank.
    root = world - 1
    x = torch.full((n,), float(rank), device=dev)
    x.add_(1)
    dist.broadcast(x, src=root)
    expect("broadcast", x - 1, torch.full((n,), float(root)))

    # reduce to rank 0.
    x = torch.full((n,), float(rank + 1), device=dev)
    dist.reduce(x, dst=0)
    if rank == 0:
        expect("reduce", x, torch.full((n,), float(total)))

    # all_gather (list) and all_gather_into_tensor.
    x = torch.full((1000,), float(rank), device=dev)
    outs = [torch.empty(1000, device=dev) for _ in range(world)]
    dist.all_gather(outs, x)
    expect("all_gather", torch.stack(outs), torch.arange(world, dtype=torch.float32).repeat_interleave(1000).view(world, 1000))
    out = torch.empty(world * n, device=dev)
    dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=dev))
    expect("all_gather_into_tensor", out, torch.arange(world, dtype=torch.float32).repeat_interleave(n))

    # reduce_scatter_tensor.
    inp = torch.arange(world * 1024, device=dev, dtype=torch.float32) * (rank + 1)
    out = torch.empty(1024, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    expect("reduce_scatter_tensor", out, torch.arange(rank * 1024, (rank + 1) * 1024, dtype=torch.float32) * total)

    # all_to_all_single: block d of rank s holds s * 100 + d.
    inp = torch.cat([torch.full((512,), float(rank * 100 + d), device=dev) for d in range(world)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    expect("all_to_all_single", out, torch.cat([torch.full((512,), float(s * 100 + rank)) for s in range(world)]))

    # send/recv around the ring.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if world > 1:
        s = torch.full((n,), float(rank), device=dev)
        r = torch.empty(n, device=dev)
        reqs = [dist.isend(s, nxt), dist.irecv(r, prv)]
        for q in reqs:
            q.wait()
        expect("isend/irecv", r + 0, torch.full((n,), float(prv)))

    # A CUDA tensor and a CPU tensor in one call: a clear error.
    if dev.type == "cuda":
        try:
            dist.all_gather([torch.empty(4, device=dev), torch.empty(4)] + [torch.empty(4, device=dev)] * (world - 2),
                            torch.empty(4, device=dev))
            fails.append(f"rank {rank}: a call mixing CUDA and CPU tensors was accepted")
        except (RuntimeError, ValueError) as e:
            if "device" not in str(e):
                fails.append(f"rank {rank}: mixing devices raised without naming it: {e}")


def worker(rank, world, port, device, q):
    import torch
    import torch.distributed as dist
    import c4comm_torch  # noqa: F401  (registers backend "c4")

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    fails = []
    try:
        if device == "cuda":
            torch.cuda.set_device(0)
            dev = torch.device("cuda", 0)
        else:
            dev = torch.device("cpu")
        dist.init_process_group("c4", rank=rank, world_size=world)
        side = torch.cuda.Stream() if device == "cuda" else None
        for on_side in (False, True):
            ctx = torch.cuda.stream(side) if on_side and side is not None else contextlib.nullcontext()
            with ctx:
                checks(rank, world, dev, fails)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001  (reported to the parent)
        fails.append(f"rank {rank}: {type(e).__name__}: {e}")
    q.put((rank, fails))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--port", type=int, default=29551)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, args.port, args.device, q)) for r in range(args.world)]
    for p in procs:
        p.start()
    fails = []
    for _ in procs:
        fails += q.get(timeout=args.timeout)[1]
    for p in procs:
        p.join(timeout=60)
    fails += [f"rank process exit code {p.exitcode}" for p in procs if p.exitcode != 0]
    for f in fails:
        print("FAIL:", f)
    print(f"c4 backend, {args.world} ranks, {args.device} tensors: {'all checks passed' if not fails else 'FAILED'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
