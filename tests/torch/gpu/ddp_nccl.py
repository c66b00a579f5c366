#!/usr/bin/env python3
"""PyTorch's own `nccl` backend on c4comm's libnccl.so.2 (GPU; scripts/gpu-check.sh runs it).

PyTorch loads NVIDIA's libnccl.so.2 as a shared library; LD_PRELOAD of ours makes every nccl*
symbol resolve to c4comm (docs/cuda.md). This script trains a small MLP with DDP and records the
losses, the final parameters and which NCCL each rank really ran (the libraries mapped into it):

  ddp_nccl.py --world 2 --steps 30 --out run.json      # run under LD_PRELOAD=.../libnccl.so.2

Every rank sees half of one fixed global batch, so the losses of W ranks equal (up to float
rounding) those of one rank on the whole batch: `--compare a.json b.json` checks two runs against
each other (the losses within a relative 1e-5; the parameters identical across ranks within a run).
Several ranks share GPU 0 (NVIDIA's NCCL refuses that; c4comm does not).

`--backend c4` runs the same training on c4comm's own torch backend (c4comm_torch on PYTHONPATH,
built for this torch by scripts/gpu-torch-backend.sh) with CUDA tensors.
"""
import argparse
import json
import os
import sys


def worker(rank, world, steps, port, out, q, backend="nccl"):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    if backend == "c4":
        import c4comm_torch  # noqa: F401  (registers backend "c4")
        dist.init_process_group("c4", rank=rank, world_size=world)
    else:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8)).to(dev)
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=1)  # several buckets: several allreduces per step
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(99)
    losses = []
    batch = 64
    for step in range(steps):
        x = torch.randn(batch, 64, generator=g)
        y = torch.randn(batch, 8, generator=g)
        per = batch // world
        xs, ys = x[rank * per:(rank + 1) * per].to(dev), y[rank * per:(rank + 1) * per].to(dev)
        opt.zero_grad()
        loss = ((ddp(xs) - ys) ** 2).mean()
        loss.backward()
        opt.step()
        # The global batch's loss: the mean of the ranks' (equal-sized) shards' losses.
        l = loss.detach().clone()
        dist.all_reduce(l, op=dist.ReduceOp.SUM)
        losses.append(l.item() / world)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(gathered[0], t) for t in gathered)
    with open("/proc/self/maps") as f:
        maps = f.read()
    libs = sorted({line.split()[-1] for line in maps.splitlines() if "libnccl" in line or "libc4comm" in line})
    dist.barrier()
    dist.destroy_process_group()
    q.put({"rank": rank, "losses": losses, "identical": identical, "libs": libs, "backend": backend,
           "params": flat.double().cpu().tolist()[:64], "nccl": ".".join(map(str, torch.cuda.nccl.version()))})


def run(args):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, args.steps, args.port, args.out, q, args.backend))
             for r in range(args.world)]
    for p in procs:
        p.start()
    results = []
    for _ in procs:
        results.append(q.get(timeout=args.timeout))
    for p in procs:
        p.join(timeout=60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    results.sort(key=lambda r: r["rank"])
    with open(args.out, "w") as f:
        json.dump({"world": args.world, "preload": os.environ.get("LD_PRELOAD", ""), "ranks": results}, f)
    r0 = results[0]
    print(f"world {args.world}, backend {args.backend}: NCCL {r0['nccl']}, libraries {r0['libs']}")
    print(f"  losses: first {r0['losses'][0]:.6f}, last {r0['losses'][-1]:.6f}; parameters identical across ranks: "
          f"{all(r['identical'] for r in results)}")
    if bad or not all(r["identical"] for r in results):
        print(f"FAIL: exit codes {bad}, identical {[r['identical'] for r in results]}")
        return 1
    return 0


def compare(a_path, b_path):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    la, lb = a["ranks"][0]["losses"], b["ranks"][0]["losses"]
    worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(la, lb))
    ok = len(la) == len(lb) and worst <= 1e-5
    print(f"losses of {a_path} (world {a['world']}) vs {b_path} (world {b['world']}): {len(la)} steps, "
          f"largest relative difference {worst:.2e}: {'same' if ok else 'DIFFERENT'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="ddp.json")
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--backend", choices=["nccl", "c4"], default="nccl")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
