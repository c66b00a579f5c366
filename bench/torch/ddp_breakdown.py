#!/usr/bin/python3
"""Where a DDP step goes on CPU: compute alone against DDP with gloo and with c4, and the raw
AllReduce of the whole gradient with each backend.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/ddp_breakdown.py --ranks 2 --batch 1

The model and settings are ddp_bench.py's. Per round and rank, in the same processes: DDP steps
with gloo, with c4, DDP steps under no_sync() (no communication: the compute-only bound), DDP
steps with a comm hook that communicates nothing (DDP's own bucket copies and hooks), and one
all_reduce of a tensor as large as the gradient per step with each backend. Two variants use a
tensor from c4comm_torch.empty (shareable memory, so c4 reduces it zero-copy): "allreduce c4
shared" is that all_reduce alone; "flat grads c4 shared" is a training step without DDP whose
parameters' .grad are views of one such flat buffer (backward accumulates straight into it), then
one all_reduce of the buffer and a division by the world size before the optimizer step (no
overlap of communication with the backward, no bucket copies). Prints rank 0's median per variant
in ms. "c4 shared buckets" is DDP with gradient_as_bucket_view=True, built and run for its first
two steps inside c4comm_torch.shared_allocations(), so that its buckets live in shareable memory
and c4 reduces them zero-copy.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_bench  # noqa: E402

VARIANTS = ["gloo", "c4", "c4 shared buckets", "no_sync", "noop hook", "allreduce gloo", "allreduce c4",
            "allreduce c4 shared", "flat grads c4 shared"]


def _noop_hook(state, bucket):
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _rank(rank, ws, store, args, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import c4comm_torch

    groups = ddp_bench.setup(rank, ws, store)
    times = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            group = groups["gloo" if "gloo" in variant else "c4"]
            torch.manual_seed(0)
            model = ddp_bench._model(torch, args.width, args.depth, args.inp)
            shared = "shared" in variant
            leave = None
            if variant == "c4 shared buckets":
                ddp, leave = ddp_bench.shared_buckets(DDP, model, group)
            elif variant == "flat grads c4 shared":
                ddp = model
            else:
                ddp = DDP(model, process_group=group)
            if variant == "noop hook":  # DDP's own work (bucket copies, hooks) without communication
                ddp.register_comm_hook(None, _noop_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
            x = torch.randn(args.batch, args.inp, generator=torch.Generator().manual_seed(rank))
            numel = sum(p.numel() for p in model.parameters())
            flat = c4comm_torch.empty(numel) if shared else torch.empty(numel)
            flat.copy_(torch.randn(numel))
            if variant == "flat grads c4 shared":
                off = 0
                for p in model.parameters():  # .grad are views of the flat buffer
                    p.grad = flat[off:off + p.numel()].view_as(p)
                    off += p.numel()
            for step in range(args.warmup + args.steps):
                dist.barrier(group=groups["gloo"])
                t0 = time.perf_counter()
                if variant.startswith("allreduce"):
                    dist.all_reduce(flat, group=group)
                elif variant == "flat grads c4 shared":
                    flat.zero_()
                    ddp(x).square().mean().backward()
                    dist.all_reduce(flat, group=group)
                    flat.div_(ws)
                    opt.step()
                elif variant == "no_sync":
                    with ddp.no_sync():
                        opt.zero_grad()
                        ddp(x).square().mean().backward()
                        opt.step()
                else:
                    opt.zero_grad()
                    ddp(x).square().mean().backward()
                    opt.step()
                if step >= args.warmup:
                    times[variant].append(time.perf_counter() - t0)
                if leave and step == 1:
                    leave = leave()
            del ddp, model, opt
        if rank == 0:
            print("  round done", file=sys.stderr, flush=True)
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=3, help="hidden layers")
    ap.add_argument("--inp", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round and variant")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per round and variant (at least 2)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print("| ranks | batch | " + " | ".join(v + " (ms)" for v in VARIANTS) + " |")
    print("|---|---|" + "---|" * len(VARIANTS))
    for ws in args.ranks:
        times = ddp_bench.spawn(ws, _rank, args)
        cells = " | ".join("%.1f" % (statistics.median(times[v]) * 1e3) for v in VARIANTS)
        print("| %d | %d | %s |" % (ws, args.batch, cells), flush=True)


if __name__ == "__main__":
    main()
