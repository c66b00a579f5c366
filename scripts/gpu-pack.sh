#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs from a build made here (no GPU needed) into one folder that
# can be copied to a GPU machine with no compiler toolchain of ours, no GoogleTest and no package
# registry: the gpu test programs, c4-perf, libc4comm.so and libnccl.so.2, the kernel benchmark's
# library, and the shared libraries they load that a bare CUDA host lacks (UCX's, say), with debug
# information stripped (the whole fits the device tool's 64 MiB).
#
# Usage: scripts/gpu-pack.sh [BUILD_DIR (build)] [PACK_DIR (gpu-pack)]
# Then on the GPU machine: scripts/gpu-check.sh PACK_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PACK=${2:-gpu-pack}
cmake --build "$BUILD" -j"$(nproc)" --target c4_cuda_kernels_test cuda_coll_test c4-perf c4comm nccl c4_bench_cuda_capi
rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/lib"
for b in c4_cuda_kernels_test cuda_coll_test c4-perf; do
  strip --strip-debug -o "$PACK/bin/$b" "$BUILD/bin/$b"
done
for l in libc4comm.so.0 libnccl.so.2 libc4_bench_cuda_capi.so; do
  strip --strip-debug -o "$PACK/lib/$l" "$(readlink -f "$BUILD/lib/$l")"
done
# Everything else they load, except the C runtime every Linux has (and CUDA's driver, which is the
# GPU host's own).
for f in "$PACK"/bin/* "$PACK"/lib/*; do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | while read -r dep; do
  case "$(basename "$dep")" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*|libcuda.so.*) ;;
    libc4comm.so*|libnccl.so*) ;;
    *) [ -e "$PACK/lib/$(basename "$dep")" ] || strip --strip-debug -o "$PACK/lib/$(basename "$dep")" "$dep" ;;
  esac
done
du -sh "$PACK"
