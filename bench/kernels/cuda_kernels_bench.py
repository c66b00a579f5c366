#!/usr/bin/env python3
"""kernels/cuda against the card's ceilings, in one process on the same tensors and stream:

  - device-to-device copy (torch's copy_, a cudaMemcpyAsync) and our copy kernel;
  - torch.add(a, b, out=c) and our reduce (sum) for float32 and bfloat16;
  - our fused reduce-copy (two outputs), counted as 2 reads + 2 writes.

Bandwidth counts the bytes each operation must move (read + written). Each row is the median of
--reps timed runs (CUDA events) after warm-up; sizes below 3x the L2 rotate over enough buffer sets
that every run reads from device memory. Prints a table (ratios: ours / torch.add and ours / copy)
and writes the numbers as JSON (--json).

Usage: cuda_kernels_bench.py --lib build/lib/libc4_bench_cuda_capi.so [--sizes-mib 1,16,64,256,1024]
"""
import argparse
import ctypes
import json
import statistics
import sys

import torch

DT = {torch.float32: 7, torch.bfloat16: 9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--sizes-mib", default="1,16,64,256,1024")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_kernels_bench: no CUDA GPU", file=sys.stderr)
        return 77
    lib = ctypes.CDLL(args.lib)
    lib.c4_bench_cuda_reduce.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                                                   ctypes.c_void_p]
    lib.c4_bench_cuda_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.c4_bench_cuda_error.restype = ctypes.c_char_p
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {l2 >> 20} MiB, torch {torch.__version__}",
          flush=True)
    stream = torch.cuda.current_stream()
    sptr = ctypes.c_void_p(stream.cuda_stream)

    def check(rc):
        if rc != 0:
            raise RuntimeError("kernels/cuda: " + lib.c4_bench_cuda_error(rc).decode())

    def timed(fn, sets):
        for i in range(3):
            fn(*sets[i % len(sets)])
        times = []
        for r in range(args.reps):
            s = sets[r % len(sets)]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn(*s)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    rows = []
    for mib in [int(x) for x in args.sizes_mib.split(",")]:
        for dtype in (torch.float32, torch.bfloat16):
            nbytes = mib << 20
            n = nbytes // torch.tensor([], dtype=dtype).element_size()
            nsets = max(1, min(8, (3 * l2 + 3 * nbytes - 1) // (3 * nbytes)))
            sets = []
            for _ in range(nsets):
                a = torch.randn(n, device="cuda").to(dtype)
                b = torch.randn(n, device="cuda").to(dtype)
                c = torch.empty_like(a)
                d = torch.empty_like(a)
                sets.append((a, b, c, d))
            # Correctness on the real data first: our sum equals torch's where torch rounds the same way
            # (float32 exactly; bfloat16 is computed in float and rounded once, as torch.add does).
            a, b, c, d = sets[0]
            check(lib.c4_bench_cuda_reduce(c.data_ptr(), None, a.data_ptr(), b.data_ptr(), n, DT[dtype], 0, sptr))
            torch.add(a, b, out=d)
            torch.cuda.synchronize()
            if not torch.equal(c, d):
                print(f"MISMATCH: our {dtype} sum differs from torch.add at {mib} MiB", file=sys.stderr)
                return 1
            t_torch_add = timed(lambda a, b, c, d: torch.add(a, b, out=c), sets)
            t_ours = timed(lambda a, b, c, d: check(lib.c4_bench_cuda_reduce(c.data_ptr(), None, a.data_ptr(),
                                                                             b.data_ptr(), n, DT[dtype], 0, sptr)),
                           sets)
            t_fused = timed(lambda a, b, c, d: check(lib.c4_bench_cuda_reduce(c.data_ptr(), d.data_ptr(),
                                                                              a.data_ptr(), b.data_ptr(), n,
                                                                              DT[dtype], 0, sptr)), sets)
            t_d2d = timed(lambda a, b, c, d: c.copy_(a), sets)
            t_copy = timed(lambda a, b, c, d: check(lib.c4_bench_cuda_copy(c.data_ptr(), a.data_ptr(), nbytes,
                                                                           sptr)), sets)
            gbs = lambda moved, t: moved / t / 1e9
            row = {
                "size_mib": mib, "dtype": str(dtype).replace("torch.", ""),
                "d2d_copy_GBs": gbs(2 * nbytes, t_d2d), "our_copy_GBs": gbs(2 * nbytes, t_copy),
                "torch_add_GBs": gbs(3 * nbytes, t_torch_add), "our_reduce_GBs": gbs(3 * nbytes, t_ours),
                "our_reduce_copy_GBs": gbs(4 * nbytes, t_fused),
            }
            row["reduce_vs_torch_add"] = row["our_reduce_GBs"] / row["torch_add_GBs"]
            row["reduce_vs_d2d_copy"] = row["our_reduce_GBs"] / row["d2d_copy_GBs"]
            rows.append(row)
            print(f"{mib:6d} MiB {row['dtype']:>8}  d2d {row['d2d_copy_GBs']:7.0f}  copy {row['our_copy_GBs']:7.0f}  "
                  f"torch.add {row['torch_add_GBs']:7.0f}  reduce {row['our_reduce_GBs']:7.0f}  "
                  f"reduce-copy {row['our_reduce_copy_GBs']:7.0f} GB/s  reduce/add {row['reduce_vs_torch_add']:.3f}  "
                  f"reduce/d2d {row['reduce_vs_d2d_copy']:.3f}", flush=True)
            del sets
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
