#!/usr/bin/python3
"""Point-to-point on CPU tensors, receive from any source included: backend c4 against gloo.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/p2p_bench.py [--ranks 2 4] [--iters 200]

Both backends run in the same processes, alternating rounds (gloo, c4, gloo, c4, ...).

- pingpong (2 ranks, the others idle): rank 0 receives, then sends back; rank 1 sends, then
  receives. Rank 0 receives with src=1 ("src") or without src ("any"). Median round trip of
  rank 0, in microseconds.
- fan-in (every rank): ranks 1..n-1 each send --iters messages to rank 0, which receives them all
  without src. Median time per message at rank 0 over the rounds, in microseconds.

Sizes are float32 element counts (--sizes). Lower is better; c4/gloo < 1 means c4 is faster.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_bench  # noqa: E402  (setup and spawn)


def _pingpong(torch, dist, rank, group, n, iters, any_source):
    buf = torch.zeros(n)
    times = []
    for _ in range(iters):
        if rank == 0:
            t0 = time.perf_counter()
            if any_source:
                dist.recv(buf, group=group)
            else:
                dist.recv(buf, 1, group=group)
            dist.send(buf, 1, group=group)
            times.append(time.perf_counter() - t0)
        elif rank == 1:
            dist.send(buf, 0, group=group)
            dist.recv(buf, 0, group=group)
    return times


def _fanin(torch, dist, rank, ws, group, n, iters):
    buf = torch.zeros(n)
    if rank == 0:
        t0 = time.perf_counter()
        for _ in range(iters * (ws - 1)):
            dist.recv(buf, group=group)
        return (time.perf_counter() - t0) / (iters * (ws - 1))
    for _ in range(iters):
        dist.send(buf, 0, group=group)
    return None


def _rank(rank, ws, store, args, out):
    import torch
    import torch.distributed as dist

    groups = ddp_bench.setup(rank, ws, store)
    res = {}
    for rnd in range(args.rounds):
        for name in ("gloo", "c4"):
            group = groups[name]
            for n in args.sizes:
                for mode in ("src", "any"):
                    if ws == 2 or rank < 2:  # the pingpong runs between ranks 0 and 1
                        t = _pingpong(torch, dist, rank, group, n, args.iters + (5 if rnd == 0 else 0),
                                      mode == "any")
                        res.setdefault(("pingpong", n, mode, name), []).extend(t[5:] if rnd == 0 else t)
                    dist.barrier(group=groups["gloo"])
                t = _fanin(torch, dist, rank, ws, group, n, args.iters)
                if t is not None:
                    res.setdefault(("fan-in", n, "any", name), []).append(t)
                dist.barrier(group=groups["gloo"])
    if rank == 0:
        out.put(res)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16384, 1048576], help="float32 elements")
    ap.add_argument("--iters", type=int, default=200, help="round trips, and messages per sender, per round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print("| ranks | pattern | elements | receive | gloo (us) | c4 (us) | c4 / gloo |")
    print("|---|---|---|---|---|---|---|")
    for ws in args.ranks:
        res = ddp_bench.spawn(ws, _rank, args)
        for (pattern, n, mode, name), _ in sorted(res.items()):
            if name != "gloo":
                continue
            g = statistics.median(res[(pattern, n, mode, "gloo")]) * 1e6
            c = statistics.median(res[(pattern, n, mode, "c4")]) * 1e6
            print("| %d | %s | %d | %s | %.1f | %.1f | %.2f |" % (ws, pattern, n, mode, g, c, c / g), flush=True)


if __name__ == "__main__":
    main()
