#!/usr/bin/env bash
# The whole test suite: install, build, run every test (ctest), then the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer unless C4_SKIP_SANITIZERS=1. The sanitizer pass
# runs every test; the collective matrix there uses fewer counts (C4_TEST_QUICK=1), since it hunts
# memory errors and undefined behavior and the full matrix already checked the values.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
# Every run leaves a trace by default (docs/tracing.md); the suite's traces go into the build tree
# instead of /tmp/c4trace, fresh each run.
export C4_TRACE_DIR="$PWD/build/test-traces"
rm -rf "$C4_TRACE_DIR"
echo "[test] ctest (build/)"
(cd build && ctest --output-on-failure -j2 --timeout 1200 --output-junit ctest-junit.xml)
# Every expected suite ran and nothing skipped itself (a missing prerequisite fails the run instead
# of leaving it green; C4_ALLOW_SKIPS=1 accepts skips on a machine that cannot run them).
python3 tools/check_suites.py build/ctest-junit.xml
# The fuzz targets, briefly: each over its seeds and regression inputs plus 20000 new inputs (docs/fuzzing.md;
# scripts/fuzz.sh runs them longer). Their own build (clang, build-fuzz/) compiles only the parsers.
echo "[test] fuzz targets (build-fuzz/, clang + libFuzzer)"
scripts/fuzz.sh --build-only
(cd build-fuzz && ctest --output-on-failure -j2 --timeout 600 --output-junit ctest-junit.xml)
python3 tools/check_suites.py build-fuzz/ctest-junit.xml --expect fuzz
# The torch backend's pytest suite runs twice: on Debian's interpreter (torch 1.13) and on the virtual
# environment scripts/torch-venv.sh made (PyPI's torch 2.x).
if [ -d build/python/c4comm_torch ]; then
  echo "[test] pytest tests/torch (backend c4, torch 1.13: /usr/bin/python3)"
  C4_TORCH_PYTHONPATH=build/python /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/torch
elif [ "${C4_ALLOW_SKIPS:-0}" = "1" ]; then
  echo "[test] tests/torch skipped for torch 1.13: c4comm_torch was not built (no torch for /usr/bin/python3)"
else
  echo "[test] FAIL: c4comm_torch was not built (no torch for /usr/bin/python3): the torch suite cannot run" >&2
  exit 1
fi
if [ -d build/python-torch2/c4comm_torch ]; then
  echo "[test] pytest tests/torch (backend c4, torch 2.x: .venv-torch)"
  C4_TORCH_PYTHONPATH=build/python-torch2 .venv-torch/bin/python -m pytest -q -p no:cacheprovider tests/torch
elif [ "${C4_ALLOW_SKIPS:-0}" = "1" ]; then
  echo "[test] tests/torch skipped for torch 2.x: c4comm_torch was not built for .venv-torch"
else
  echo "[test] FAIL: c4comm_torch was not built for torch 2.x (.venv-torch: scripts/torch-venv.sh)" >&2
  exit 1
fi
if [ "${C4_SKIP_SANITIZERS:-0}" != "1" ]; then
  echo "[test] ctest under ASan+UBSan (build-asan/)"
  BUILD_DIR=build-asan BUILD_TYPE=Debug scripts/build.sh -DC4_SANITIZE=address,undefined -DC4_WITH_TORCH=OFF
  (cd build-asan && C4_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j2 --timeout 1800 -LE nosan --output-junit ctest-junit.xml)
  python3 tools/check_suites.py build-asan/ctest-junit.xml --only-skips
fi
