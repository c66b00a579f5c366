#!/usr/bin/env bash
# The whole test suite: install, build, run every test (ctest), then the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer unless C4_SKIP_SANITIZERS=1. The sanitizer pass
# runs every test; the collective matrix there uses fewer counts (C4_TEST_QUICK=1), since it hunts
# memory errors and undefined behavior and the full matrix already checked the values.
#
# On 2 cores the run keeps both busy (docs/testing.md, "Time"): the sanitizer build compiles at the
# lowest priority while the main tests run (many of them wait on timers), and the Soft-RoCE VM tests
# (CPU-bound emulation, one at a time) run beside the fuzz targets and the torch suites. Each stage's
# wall time is printed at the end, whether the run passed or not.
set -euo pipefail
cd "$(dirname "$0")/.."

STAGES=()
STAGE=""
STAGE_T0=0
RUN_T0=$SECONDS
BG_PIDS=()
# begin NAME: the previous stage ended; NAME starts.
begin() {
  end_stage ok
  STAGE=$1
  STAGE_T0=$SECONDS
  echo "[test] $1"
}
end_stage() {
  if [ -n "$STAGE" ]; then
    note "$STAGE" $((SECONDS - STAGE_T0)) "$1"
    STAGE=""
  fi
}
note() {  # note NAME SECONDS STATUS: a line of the stage table
  STAGES+=("$(printf '  %-62s %4dm%02ds  %s' "$1" $(($2 / 60)) $(($2 % 60)) "$3")")
}
summary() {
  local rc=$?
  end_stage "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)"
  for p in "${BG_PIDS[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  local s=$((SECONDS - RUN_T0))
  echo "[test] stage times ($(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs);" \
       "AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)${C4_KERNELS_ISA_MAX:+, kernels capped at $C4_KERNELS_ISA_MAX}):"
  printf '%s\n' "${STAGES[@]}"
  printf '  %-62s %4dm%02ds  %s\n' "total" $((s / 60)) $((s % 60)) "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (rc $rc)")"
}
trap summary EXIT
# background NAME LOG CMD...: runs CMD in the background (its own process group), output to LOG; the
# pid goes to BG_PID. finish NAME PID LOG T0: waits for it, adds its line to the table, and fails
# the run (showing the end of LOG) if it failed.
background() {
  local log=$2
  shift 2
  set -m
  ("$@") > "$log" 2>&1 &
  BG_PID=$!
  set +m
  BG_PIDS+=("$BG_PID")
}
finish() {
  local rc=0
  wait "$2" || rc=$?
  note "$1" $((SECONDS - $4)) "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)"
  if [ "$rc" -ne 0 ]; then
    echo "[test] FAIL: $1 (rc $rc); the end of $3:" >&2
    tail -n 60 "$3" >&2
    exit "$rc"
  fi
  echo "[test] $1: ok ($3)"
}

begin "install (scripts/deps.sh)"
scripts/deps.sh
begin "build (build/)"
scripts/build.sh
# Every run leaves a trace by default (docs/tracing.md); the suite's traces go into the build tree
# instead of /tmp/c4trace, fresh each run.
export C4_TRACE_DIR="$PWD/build/test-traces"
rm -rf "$C4_TRACE_DIR"
sanitize=1
[ "${C4_SKIP_SANITIZERS:-0}" = "1" ] && sanitize=0
if [ "$sanitize" = 1 ]; then
  # The CUDA kernels only as PTX there (no GPU runs this build; nvcc takes a third of the time).
  asan_t0=$SECONDS
  background asan-build build/asan-build.log \
    env BUILD_DIR=build-asan BUILD_TYPE=Debug nice -n 19 scripts/build.sh -DC4_SANITIZE=address,undefined \
    -DC4_WITH_TORCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90-virtual
  asan_pid=$BG_PID
  echo "[test] building build-asan/ beside the tests, at the lowest priority (build/asan-build.log)"
fi
begin "ctest (build/; all but the Soft-RoCE VM tests)"
(cd build && ctest --output-on-failure -j2 --timeout 1200 -LE rdma --output-junit ctest-junit.xml)
# The Soft-RoCE VMs (one at a time), beside the fuzz targets and the torch suites.
rdma_t0=$SECONDS
background rdma-vm build/rdma-vm.log \
  bash -c 'cd build && ctest --output-on-failure --timeout 1500 -L rdma --output-junit ctest-junit-rdma.xml'
rdma_pid=$BG_PID
echo "[test] Soft-RoCE VM tests beside what follows (build/rdma-vm.log)"
# The fuzz targets, briefly: each over its seeds and regression inputs plus 20000 new inputs (docs/fuzzing.md;
# scripts/fuzz.sh runs them longer). Their own build (clang, build-fuzz/) compiles only the parsers.
begin "fuzz targets (build-fuzz/, clang + libFuzzer)"
scripts/fuzz.sh --build-only
(cd build-fuzz && ctest --output-on-failure -j2 --timeout 600 --output-junit ctest-junit.xml)
python3 tools/check_suites.py build-fuzz/ctest-junit.xml --expect fuzz
# The torch backend's pytest suite runs twice, side by side: on Debian's interpreter (torch 1.13)
# and on the virtual environment scripts/torch-venv.sh made (PyPI's torch 2.x).
end_stage ok
echo "[test] pytest tests/torch, torch 1.13 and 2.x side by side"
for v in 1 2; do
  if [ "$v" = 1 ]; then dir=build/python py=/usr/bin/python3 what="torch 1.13: /usr/bin/python3"; else
    dir=build/python-torch2 py=.venv-torch/bin/python what="torch 2.x: .venv-torch"; fi
  if [ ! -d "$dir/c4comm_torch" ]; then
    if [ "${C4_ALLOW_SKIPS:-0}" = "1" ]; then
      echo "[test] tests/torch skipped for $what: c4comm_torch was not built"
      continue
    fi
    echo "[test] FAIL: c4comm_torch was not built for $what (scripts/torch-venv.sh): the torch suite cannot run" >&2
    exit 1
  fi
  eval "t${v}=\$SECONDS"
  background "pytest$v" "build/pytest-torch$v.log" \
    env C4_TORCH_PYTHONPATH="$dir" "$py" -m pytest -q -p no:cacheprovider -rs tests/torch
  eval "p${v}=\$BG_PID"
done
[ -n "${p1:-}" ] && finish "pytest tests/torch, torch 1.13 (beside 2.x)" "$p1" build/pytest-torch1.log "$t1"
[ -n "${p2:-}" ] && finish "pytest tests/torch, torch 2.x (beside 1.13)" "$p2" build/pytest-torch2.log "$t2"
finish "ctest -L rdma (the Soft-RoCE VMs, beside fuzz and pytest)" "$rdma_pid" build/rdma-vm.log "$rdma_t0"
# Every expected suite ran and nothing skipped itself without a reason this machine bears out (a
# missing prerequisite fails the run instead of leaving it green; C4_ALLOW_SKIPS=1 accepts skips on
# a machine that cannot run them). The GPU tests are listed as not run: no GPU.
python3 tools/check_suites.py build/ctest-junit.xml build/ctest-junit-rdma.xml
if [ "$sanitize" = 1 ]; then
  finish "build under ASan+UBSan (build-asan/, beside the ctest)" "$asan_pid" build/asan-build.log "$asan_t0"
  begin "ctest under ASan+UBSan (build-asan/)"
  (cd build-asan && C4_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j2 --timeout 1800 -LE nosan --output-junit ctest-junit.xml)
  python3 tools/check_suites.py build-asan/ctest-junit.xml --only-skips
fi
