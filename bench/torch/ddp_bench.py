#!/usr/bin/python3
"""DDP (or FSDP2) step time on CPU: backend c4 against gloo in the same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/ddp_bench.py --ranks 2 4
    PYTHONPATH=build/python-torch2 .venv-torch/bin/python bench/torch/ddp_bench.py --ranks 2 --fsdp2

Every rank trains the same MLP (12.6 M parameters by default) on its own data with DDP. The two
backends run in the same processes, alternating rounds (gloo, c4, gloo, c4, ...), so both see
the same machine load. Reported: the median step time (rank 0, after warm-up) per backend and
c4/gloo (lower is better). torch.set_num_threads(1) per rank.

--bucket-view builds every DDP with gradient_as_bucket_view=True. --shared-buckets adds a third
variant, "c4 shared": DDP over c4 with gradient_as_bucket_view=True, built and run for its first
two steps inside c4comm_torch.shared_allocations(), so its buckets (the gradients) live in
shareable memory and c4 reduces them zero-copy (docs/torch.md).

--fsdp2 (torch 2.x) shards the same model with fully_shard (each Linear, then the root) over a
DeviceMesh of the backend's group instead of DDP: AllGather of the parameters forward and backward,
ReduceScatter of the gradients.
"""

import argparse
import datetime
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time


def _model(torch, width, depth, inp):
    layers, d = [], inp
    for _ in range(depth):
        layers += [torch.nn.Linear(d, width), torch.nn.ReLU()]
        d = width
    layers.append(torch.nn.Linear(d, inp))
    return torch.nn.Sequential(*layers)


def setup(rank, ws, store):
    """In a rank's process: one thread, the gloo world group and a c4 group over the same ranks."""
    import torch
    import torch.distributed as dist

    import c4comm_torch  # noqa: F401

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=ws, timeout=timeout)
    return {"gloo": dist.group.WORLD, "c4": dist.new_group(backend="c4", timeout=timeout)}


def spawn(ws, target, args):
    """Runs target(rank, ws, store, args, queue) in ws fresh processes; returns what rank 0 put."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = os.path.join(tempfile.mkdtemp(prefix="c4ddp-"), "store")
    procs = [ctx.Process(target=target, args=(r, ws, store, args, out)) for r in range(ws)]
    for p in procs:
        p.start()
    result = out.get(timeout=1800)
    for p in procs:
        p.join()
    shutil.rmtree(os.path.dirname(store), ignore_errors=True)
    if any(p.exitcode != 0 for p in procs):
        sys.exit("a rank failed")
    return result


def shared_buckets(DDP, model, group):
    """DDP over `group` with gradient_as_bucket_view=True whose buckets live in shareable memory
    (c4comm_torch.shared_allocations, docs/torch.md). Returns (ddp, leave): call leave() after the
    second step, when DDP has rebuilt its buckets; it returns None."""
    import c4comm_torch

    ctx = c4comm_torch.shared_allocations()
    ctx.__enter__()
    try:
        ddp = DDP(model, process_group=group, gradient_as_bucket_view=True)
    except BaseException:
        ctx.__exit__(None, None, None)
        raise
    return ddp, lambda: ctx.__exit__(None, None, None)


def _rank(rank, ws, store, args, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    groups = setup(rank, ws, store)
    variants = dict(groups)
    if args.shared_buckets:
        variants["c4 shared"] = groups["c4"]
    times = {k: [] for k in variants}
    params = 0
    for rnd in range(args.rounds):
        for name, group in variants.items():
            torch.manual_seed(0)
            model = _model(torch, args.width, args.depth, args.inp)
            params = sum(p.numel() for p in model.parameters())
            leave = None
            if args.fsdp2:
                from torch.distributed.device_mesh import DeviceMesh
                from torch.distributed.fsdp import fully_shard

                mesh = DeviceMesh.from_group(group, "cpu")
                for m in model:
                    if isinstance(m, torch.nn.Linear):
                        fully_shard(m, mesh=mesh)
                ddp = fully_shard(model, mesh=mesh)
            elif name == "c4 shared":
                ddp, leave = shared_buckets(DDP, model, group)
            else:
                ddp = DDP(model, process_group=group, gradient_as_bucket_view=args.bucket_view)
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
            gen = torch.Generator().manual_seed(rank)
            x = torch.randn(args.batch, args.inp, generator=gen)
            for step in range(args.warmup + args.steps):
                dist.barrier(group=groups["gloo"])
                t0 = time.perf_counter()
                opt.zero_grad()
                ddp(x).square().mean().backward()
                opt.step()
                dt = time.perf_counter() - t0
                if step >= args.warmup:
                    times[name].append(dt)
                if leave and step == 1:
                    leave = leave()
            del ddp, model, opt
    if rank == 0:
        out.put((params, times))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=3, help="hidden layers")
    ap.add_argument("--inp", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round and backend")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per round and backend (at least 2)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view=True for every DDP")
    ap.add_argument("--shared-buckets", action="store_true", help="add the 'c4 shared' variant (see above)")
    ap.add_argument("--fsdp2", action="store_true", help="FSDP2 (fully_shard) instead of DDP (torch 2.x)")
    args = ap.parse_args()
    if args.fsdp2 and args.shared_buckets:
        ap.error("--shared-buckets is a DDP variant")
    args.warmup = max(2, args.warmup)
    shared = args.shared_buckets
    print("| ranks | params | gloo median step (ms) | c4 median step (ms) | c4 / gloo |" +
          (" c4 shared (ms) | c4 shared / gloo |" if shared else ""))
    print("|---|---|---|---|---|" + ("---|---|" if shared else ""))
    for ws in args.ranks:
        params, times = spawn(ws, _rank, args)
        g = statistics.median(times["gloo"]) * 1e3
        c = statistics.median(times["c4"]) * 1e3
        row = "| %d | %.1f M | %.1f | %.1f | %.2f |" % (ws, params / 1e6, g, c, c / g)
        if shared:
            cs = statistics.median(times["c4 shared"]) * 1e3
            row += " %.1f | %.2f |" % (cs, cs / g)
        print(row, flush=True)


if __name__ == "__main__":
    main()
