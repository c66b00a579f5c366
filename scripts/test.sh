#!/usr/bin/env bash
# The whole test suite: install, build, run every test (ctest), then the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer unless C4_SKIP_SANITIZERS=1. The sanitizer pass
# runs every test; the collective matrix there uses fewer counts (C4_TEST_QUICK=1), since it hunts
# memory errors and undefined behavior and the full matrix already checked the values.
# Each stage's wall time is printed at the end, whether the run passed or not (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

STAGES=()
STAGE=""
STAGE_T0=0
RUN_T0=$SECONDS
# begin NAME: the previous stage ended; NAME starts.
begin() {
  end_stage ok
  STAGE=$1
  STAGE_T0=$SECONDS
  echo "[test] $1"
}
end_stage() {
  if [ -n "$STAGE" ]; then
    local s=$((SECONDS - STAGE_T0))
    STAGES+=("$(printf '  %-58s %4dm%02ds  %s' "$STAGE" $((s / 60)) $((s % 60)) "$1")")
    STAGE=""
  fi
}
summary() {
  local rc=$?
  end_stage "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)"
  local s=$((SECONDS - RUN_T0))
  echo "[test] stage times ($(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs);" \
       "AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)):"
  printf '%s\n' "${STAGES[@]}"
  printf '  %-58s %4dm%02ds  %s\n' "total" $((s / 60)) $((s % 60)) "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (rc $rc)")"
}
trap summary EXIT

begin "install (scripts/deps.sh)"
scripts/deps.sh
begin "build (build/)"
scripts/build.sh
# Every run leaves a trace by default (docs/tracing.md); the suite's traces go into the build tree
# instead of /tmp/c4trace, fresh each run.
export C4_TRACE_DIR="$PWD/build/test-traces"
rm -rf "$C4_TRACE_DIR"
begin "ctest (build/)"
(cd build && ctest --output-on-failure -j2 --timeout 1200 --output-junit ctest-junit.xml)
# Every expected suite ran and nothing skipped itself without a reason this machine bears out (a
# missing prerequisite fails the run instead of leaving it green; C4_ALLOW_SKIPS=1 accepts skips on
# a machine that cannot run them). The GPU tests are listed as not run: no GPU.
python3 tools/check_suites.py build/ctest-junit.xml
# The fuzz targets, briefly: each over its seeds and regression inputs plus 20000 new inputs (docs/fuzzing.md;
# scripts/fuzz.sh runs them longer). Their own build (clang, build-fuzz/) compiles only the parsers.
begin "fuzz targets (build-fuzz/, clang + libFuzzer)"
scripts/fuzz.sh --build-only
(cd build-fuzz && ctest --output-on-failure -j2 --timeout 600 --output-junit ctest-junit.xml)
python3 tools/check_suites.py build-fuzz/ctest-junit.xml --expect fuzz
# The torch backend's pytest suite runs twice: on Debian's interpreter (torch 1.13) and on the virtual
# environment scripts/torch-venv.sh made (PyPI's torch 2.x).
begin "pytest tests/torch (torch 1.13: /usr/bin/python3)"
if [ -d build/python/c4comm_torch ]; then
  C4_TORCH_PYTHONPATH=build/python /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs tests/torch
elif [ "${C4_ALLOW_SKIPS:-0}" = "1" ]; then
  echo "[test] tests/torch skipped for torch 1.13: c4comm_torch was not built (no torch for /usr/bin/python3)"
else
  echo "[test] FAIL: c4comm_torch was not built (no torch for /usr/bin/python3): the torch suite cannot run" >&2
  exit 1
fi
begin "pytest tests/torch (torch 2.x: .venv-torch)"
if [ -d build/python-torch2/c4comm_torch ]; then
  C4_TORCH_PYTHONPATH=build/python-torch2 .venv-torch/bin/python -m pytest -q -p no:cacheprovider -rs tests/torch
elif [ "${C4_ALLOW_SKIPS:-0}" = "1" ]; then
  echo "[test] tests/torch skipped for torch 2.x: c4comm_torch was not built for .venv-torch"
else
  echo "[test] FAIL: c4comm_torch was not built for torch 2.x (.venv-torch: scripts/torch-venv.sh)" >&2
  exit 1
fi
if [ "${C4_SKIP_SANITIZERS:-0}" != "1" ]; then
  begin "build under ASan+UBSan (build-asan/)"
  BUILD_DIR=build-asan BUILD_TYPE=Debug scripts/build.sh -DC4_SANITIZE=address,undefined -DC4_WITH_TORCH=OFF
  begin "ctest under ASan+UBSan (build-asan/)"
  (cd build-asan && C4_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j2 --timeout 1800 -LE nosan --output-junit ctest-junit.xml)
  python3 tools/check_suites.py build-asan/ctest-junit.xml --only-skips
fi
