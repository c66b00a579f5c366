#!/usr/bin/env python3
"""C4D example for PyTorch: a training loop on backend "c4" that loses a rank, is told which one
and why, rebuilds its process group without it and continues from its last state (docs/c4d.md).

    PYTHONPATH=build/python /usr/bin/python3 examples/torch/c4d_shrink.py --ranks 4 --kill-rank 2 --kill-step 5

Each rank trains the same small model on its own data shard; gradients are averaged with
all_reduce. After every good step each rank keeps a copy of the model and optimizer state (the
checkpoint; identical on every rank, since every step ends with the same averaged gradients). When
a step raises, the exception's text carries c4comm's diagnosis ("[C4D dead_rank: rank 2 died
...]") and c4comm_torch.diagnoses() the structured records: the survivors drop the culprit ranks,
destroy the process group, make a new one of the ranks that are left (a new store generation;
ranks renumbered in order), restore the checkpoint and redo the step. Exit status 0 when the
survivors finish with identical parameters.
"""

import argparse
import copy
import datetime
import multiprocessing as mp
import os
import signal
import sys
import tempfile

FATAL = ("dead_rank", "noncomm_hang")  # classes that name ranks to exclude (a link fault names none)


def train(rank, world, store_dir, args, out):
    import torch
    import torch.distributed as dist

    import c4comm_torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ranks = list(range(world))  # original ranks still in the job
    generation = 0
    dist.init_process_group("c4", init_method="file://%s/store%d" % (store_dir, generation), rank=rank,
                            world_size=world, timeout=timeout)
    gen = torch.Generator().manual_seed(1000 + rank)  # this rank's data shard
    data = [(torch.randn(32, 64, generator=gen), torch.randn(32, 1, generator=gen)) for _ in range(args.steps)]
    ckpt = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), 0)
    step = 0
    seen = 0  # diagnoses already acted on
    while step < args.steps:
        if rank == args.kill_rank and step == args.kill_step:
            print("rank %d: dying at step %d" % (rank, step), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = data[step]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        try:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= len(ranks)
        except RuntimeError as e:
            print("rank %d: step %d failed: %s" % (rank, step, e), flush=True)
            culprits = set()
            records = c4comm_torch.diagnoses()
            for d in records[seen:]:  # this group's (earlier ones used the ranks of earlier groups)
                if d["class"] in FATAL:
                    culprits.update(ranks[r] for r in d["culprit"]["ranks"])  # ranks of the group that failed
                    print("rank %d: C4D says %s: %s" % (rank, d["class"], d["summary"]), flush=True)
            seen = len(records)
            if not culprits:
                print("rank %d: no rank to exclude; giving up" % rank, flush=True)
                out.put((rank, None))
                return
            dist.destroy_process_group()
            ranks = [r for r in ranks if r not in culprits]
            generation += 1
            dist.init_process_group("c4", init_method="file://%s/store%d" % (store_dir, generation),
                                    rank=ranks.index(rank), world_size=len(ranks), timeout=timeout)
            model.load_state_dict(ckpt[0])
            opt.load_state_dict(ckpt[1])
            step = ckpt[2]
            print("rank %d: continues as rank %d of %d from step %d" % (rank, ranks.index(rank), len(ranks), step),
                  flush=True)
            continue
        opt.step()
        step += 1
        ckpt = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), step)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    same = bool(torch.equal(lo, hi))
    print("rank %d: finished %d steps with %d ranks; parameters %s" %
          (rank, args.steps, len(ranks), "identical on every rank" if same else "DIFFER"), flush=True)
    dist.destroy_process_group()
    out.put((rank, same))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--timeout", type=float, default=30, help="process group timeout, seconds")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="c4d-torch-") as store_dir:
        procs = [ctx.Process(target=train, args=(r, args.ranks, store_dir, args, out)) for r in range(args.ranks)]
        for p in procs:
            p.start()
        results = {}
        survivors = [r for r in range(args.ranks) if r != args.kill_rank]
        for _ in survivors:
            try:
                r, same = out.get(timeout=args.timeout * 4 + 60)
            except Exception:
                break
            results[r] = same
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    ok = sorted(results) == survivors and all(results.values())
    print("ok: the survivors rebuilt the group without the lost rank and finished" if ok else
          "FAILED: %s" % results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
