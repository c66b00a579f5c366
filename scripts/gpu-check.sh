#!/usr/bin/env bash
# Everything that needs a GPU, in one command, on a GPU machine (docs/cuda.md): the gpu-labelled
# tests, the kernel benchmark beside torch.add and the card's device-to-device copy, and a report.
# Works from a build made on a machine without a GPU and copied over (the GPU host may have no
# GoogleTest and no package registry): the test programs carry GoogleTest and the CUDA runtime
# statically; the benchmark needs python3 with a CUDA torch.
#
# Usage: scripts/gpu-check.sh [BUILD_DIR (build)] [REPORT_DIR (gpu-report)]
# Exit status: 0 when every check ran and passed; 1 when one failed; 77 when there is no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
REPORT=${2:-gpu-report}
mkdir -p "$REPORT"
SUMMARY="$REPORT/gpu-check.md"
failed=0

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU (nvidia-smi -L failed)" >&2
  exit 77
fi
{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo '```'
  echo
  echo "## Tests (label gpu)"
  echo
} >"$SUMMARY"

# The programs holding gpu-labelled tests (tests/*/CMakeLists.txt). Run directly, not through ctest:
# a copied build tree's CTestTestfiles name the paths of the machine that built it.
GPU_TESTS=(c4_cuda_kernels_test)
for t in "${GPU_TESTS[@]}"; do
  bin="$BUILD/bin/$t"
  if [ ! -x "$bin" ]; then
    echo "- $t: MISSING from $BUILD/bin" | tee -a "$SUMMARY"
    failed=1
    continue
  fi
  echo "[gpu-check] $t"
  "$bin" --gtest_output="xml:$REPORT/$t.xml" >"$REPORT/$t.log" 2>&1
  rc=$?
  passed=$(grep -c '^\[       OK \]' "$REPORT/$t.log")
  failures=$(grep -c '^\[  FAILED  \] .*(' "$REPORT/$t.log")
  # On a GPU only the no-GPU test may skip itself.
  skips=$(grep '^\[  SKIPPED \] .*(' "$REPORT/$t.log" | grep -vc 'CudaRuntime\.')
  echo "- $t: exit $rc, $passed passed, $failures failed, $skips skipped" | tee -a "$SUMMARY"
  grep '^\[  FAILED  \] .*(' "$REPORT/$t.log" | sed 's/^/  /' >>"$SUMMARY"
  if [ "$rc" -ne 0 ] || [ "$failures" -ne 0 ] || [ "$skips" -ne 0 ]; then failed=1; fi
done

echo "[gpu-check] kernel benchmark (kernels/cuda vs torch.add and device-to-device copy)"
{
  echo
  echo "## Kernel benchmark (bench/kernels/cuda_kernels_bench.py)"
  echo
  echo '```'
} >>"$SUMMARY"
if [ -f "$BUILD/lib/libc4_bench_cuda_capi.so" ]; then
  PYTHONUNBUFFERED=1 python3 bench/kernels/cuda_kernels_bench.py --lib "$BUILD/lib/libc4_bench_cuda_capi.so" \
    --json "$REPORT/kernels_bench.json" ${C4_GPU_BENCH_ARGS:-} 2>&1 | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
else
  echo "MISSING: $BUILD/lib/libc4_bench_cuda_capi.so" | tee -a "$SUMMARY"
  failed=1
fi
echo '```' >>"$SUMMARY"

echo
echo "[gpu-check] report: $SUMMARY ($([ $failed -eq 0 ] && echo passed || echo FAILED))"
exit $failed
