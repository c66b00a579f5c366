#!/usr/bin/env bash
# Everything that needs a GPU, in one command, on a GPU machine (docs/cuda.md), writing one report:
#  1. the gpu-labelled tests (kernels bit for bit against the host; every collective x dtype x op on
#     device buffers with 1, 2 and 4 ranks on one GPU; stream order; non-blocking; errors);
#  2. the kernel benchmark beside torch.add and the card's device-to-device copy;
#  3. c4-perf on device buffers (nccl-tests table), 2 ranks on one GPU: the device zero-copy path
#     (CUDA IPC) and the staged path;
#  4. PyTorch's own nccl backend on c4comm's libnccl.so.2 (LD_PRELOAD): DDP, losses compared with
#     NVIDIA's NCCL;
#  5. c4comm's own torch backend "c4" on CUDA tensors (built here for this machine's torch by
#     scripts/gpu-torch-backend.sh): every collective in stream order, and DDP against NVIDIA's NCCL.
# Works from a build made on a machine without a GPU and copied over (the GPU host may have no
# GoogleTest and no package registry): scripts/gpu-pack.sh packs one (test programs with GoogleTest
# and the CUDA runtime inside, the libraries they load); a build tree works too. Steps 2 and 4 need
# python3 with a CUDA torch.
#
# Usage: scripts/gpu-check.sh [BUILD_OR_PACK_DIR (build)] [REPORT_DIR (gpu-report)]
#        C4_GPU_CHECK_STEPS="tests bench perf torch c4torch" selects steps.
# Exit status: 0 when every check ran and passed; 1 when one failed; 77 when there is no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
REPORT=${2:-gpu-report}
mkdir -p "$REPORT"
REPORT=$(cd "$REPORT" && pwd)
BUILD=$(cd "$BUILD" && pwd)
SUMMARY="$REPORT/gpu-check.md"
STEPS=${C4_GPU_CHECK_STEPS:-tests bench perf torch c4torch}
export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0
step() { [[ " $STEPS " == *" $1 "* ]]; }

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

# The programs holding gpu-labelled tests (tests/*/CMakeLists.txt), in passes "program:filter:seconds".
# Run directly, not through ctest: a copied build tree's CTestTestfiles name the paths of the machine
# that built it. cuda_coll_test goes in passes, the code never run on a GPU before last (CUDA IPC
# first with 2 ranks and a short limit: a hang there, e.g. a driver call that synchronizes the
# device while a stream waits, costs two minutes, not the device budget), each with its own log.
GPU_TESTS=(
  "c4_cuda_kernels_test:*:300"
  "cuda_coll_test:Cuda.*:CudaColl*:Ranks/CudaColl.*:CudaMem.*:CudaIpcOff.*:300"
  "cuda_coll_test:Ranks/CudaIpc.*2ranks*:150"
  "cuda_coll_test:Ranks/CudaIpc.*3ranks*:Ranks/CudaIpc.*4ranks*:Modes/CudaIpcFallback.*:300"
  "cuda_coll_test:CudaPipeline.*:CudaIpcRegistered.*:240"
  "cuda_coll_test:Modes/CudaWindow.*:CudaWindowOneProcess.*:CudaWindowErrors.*:CudaWindowStreams.*:180"
)
step tests || GPU_TESTS=()
pass=0
for entry in "${GPU_TESTS[@]}"; do
  t=${entry%%:*}
  rest=${entry#*:}
  limit=${rest##*:}
  filter=${rest%:*}
  pass=$((pass + 1))
  log="$REPORT/$t.$pass.log"
  bin="$BUILD/bin/$t"
  if [ ! -x "$bin" ]; then
    echo "- $t: MISSING from $BUILD/bin" | tee -a "$SUMMARY"
    failed=1
    continue
  fi
  echo "[gpu-check] $t --gtest_filter=$filter (limit ${limit} s)"
  # timeout signals its whole process group: the forked ranks of a hung test go too.
  timeout -k 10 "${C4_GPU_TEST_TIMEOUT:-$limit}" "$bin" --gtest_filter="$filter" \
    --gtest_output="xml:$REPORT/$t.$pass.xml" >"$log" 2>&1
  rc=$?
  passed=$(grep -c '^\[       OK \]' "$log")
  failures=$(grep -c '^\[  FAILED  \] .*(' "$log")
  # On a GPU only the no-GPU test may skip itself.
  skips=$(grep '^\[  SKIPPED \] .*(' "$log" | grep -vc 'CudaRuntime\.')
  hung=""
  [ "$rc" -eq 124 ] && hung=" (TIMED OUT in $(grep '^\[ RUN      \]' "$log" | tail -1 | sed 's/^\[ RUN      \] //'))"
  echo "- $t $filter: exit $rc$hung, $passed passed, $failures failed, $skips skipped" | tee -a "$SUMMARY"
  grep '^\[  FAILED  \] .*(' "$log" | sed 's/^/  /' >>"$SUMMARY"
  if [ "$rc" -ne 0 ] || [ "$failures" -ne 0 ] || [ "$skips" -ne 0 ]; then failed=1; fi
done

if step bench; then
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
fi

if step perf; then
  echo "[gpu-check] c4-perf on device buffers, 2 ranks on one GPU"
  {
    echo
    echo "## c4-perf --device 1 (2 ranks on one GPU)"
    echo
    echo '```'
  } >>"$SUMMARY"
  # The device zero-copy path (CUDA IPC, mapped per call and cached), and staged through host
  # memory (C4_CUDA_IPC=0), in the same run.
  for run in "allreduce ipc" "allreduce ipc-cached C4_CUDA_IPC_CACHE=16" "allreduce staged C4_CUDA_IPC=0" \
    "allgather ipc"; do
    read -r coll name envs <<<"$run"
    echo "# $coll, $name ${envs:-}" | tee -a "$SUMMARY"
    env ${envs:-} timeout 300 "$BUILD/bin/c4-perf" --device 1 -np 2 -C $coll -b 8 -e "${C4_GPU_PERF_MAX:-256M}" \
      -f 4 -n 10 -w 2 2>&1 | tee "$REPORT/c4-perf-$coll-$name.txt" | grep -v "^#  Rank" | tee -a "$SUMMARY"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
  done
  echo '```' >>"$SUMMARY"
fi

if step torch; then
  echo "[gpu-check] PyTorch's nccl backend on c4comm (DDP)"
  {
    echo
    echo "## PyTorch nccl backend on c4comm's libnccl.so.2 (tests/torch/gpu/ddp_nccl.py)"
    echo
    echo '```'
  } >>"$SUMMARY"
  ddp=tests/torch/gpu/ddp_nccl.py
  export PYTHONUNBUFFERED=1
  {
    timeout 300 python3 $ddp --world 1 --out "$REPORT/ddp-nvidia-1.json" --port 29541 &&
      LD_PRELOAD="$BUILD/lib/libnccl.so.2" timeout 300 python3 $ddp --world 1 --out "$REPORT/ddp-c4-1.json" --port 29542 &&
      LD_PRELOAD="$BUILD/lib/libnccl.so.2" timeout 300 python3 $ddp --world 2 --out "$REPORT/ddp-c4-2.json" --port 29543 &&
      python3 $ddp --compare "$REPORT/ddp-c4-1.json" "$REPORT/ddp-nvidia-1.json" &&
      python3 $ddp --compare "$REPORT/ddp-c4-2.json" "$REPORT/ddp-nvidia-1.json"
  } 2>&1 | tee "$REPORT/ddp.log" | grep -v "^\[" | tail -n 40 | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
  echo '```' >>"$SUMMARY"
fi

if step c4torch; then
  echo "[gpu-check] backend c4 on CUDA tensors"
  {
    echo
    echo "## Backend c4 (c4comm_torch) on CUDA tensors"
    echo
    echo '```'
  } >>"$SUMMARY"
  export PYTHONUNBUFFERED=1
  ddp=tests/torch/gpu/ddp_nccl.py
  {
    scripts/gpu-torch-backend.sh "$BUILD" "$REPORT/c4torch" &&
      PYTHONPATH="$REPORT/c4torch" timeout 300 python3 tests/torch/gpu/c4_cuda_collectives.py --world 2 --port 29561 &&
      PYTHONPATH="$REPORT/c4torch" timeout 300 python3 tests/torch/gpu/c4_cuda_collectives.py --world 3 --port 29562 &&
      { [ -f "$REPORT/ddp-nvidia-1.json" ] ||
        timeout 300 python3 $ddp --world 1 --out "$REPORT/ddp-nvidia-1.json" --port 29563; } &&
      PYTHONPATH="$REPORT/c4torch" timeout 300 python3 $ddp --backend c4 --world 2 --out "$REPORT/ddp-c4backend-2.json" \
        --port 29564 &&
      python3 $ddp --compare "$REPORT/ddp-c4backend-2.json" "$REPORT/ddp-nvidia-1.json"
  } 2>&1 | tee "$REPORT/c4torch.log" | grep -v "^\[W\|^W[0-9]" | tail -n 40 | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
  echo '```' >>"$SUMMARY"
fi

echo
echo "[gpu-check] report: $SUMMARY ($([ $failed -eq 0 ] && echo passed || echo FAILED))"
exit $failed
