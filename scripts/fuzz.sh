#!/usr/bin/env bash
# Builds the fuzz targets (build-fuzz/, clang, libFuzzer + ASan + UBSan) and runs them: one per parser of bytes
# that come from outside (docs/fuzzing.md).
#
#   scripts/fuzz.sh [--runs N | --seconds S] [target...]   run each target N inputs, or S seconds (default 60 s)
#   scripts/fuzz.sh --build-only                           configure and build only (what CI's ctest step needs)
#   scripts/fuzz.sh --seeds                                rewrite the seed corpora in tests/fuzz/seeds
#
# Targets: unique_id bootstrap_msgs bootstrap_stream heartbeat tcp_handshake tcp_frames topology trace (default:
# all). The corpus each run grows is kept in build-fuzz/corpus/<target> (not in git); it starts from
# tests/fuzz/seeds/<target> and tests/fuzz/regressions/<target> (every input that once crashed). A crash, leak,
# timeout or out-of-memory leaves its input in build-fuzz/artifacts/ and fails the script; keep it in
# tests/fuzz/regressions/<target>/ with the fix. Each run's output is in build-fuzz/logs/<target>.log; a line per
# target sums it up (inputs run, exec/s, seconds, coverage). FUZZ_BUILD_DIR overrides build-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
ALL=(unique_id bootstrap_msgs bootstrap_stream heartbeat tcp_handshake tcp_frames topology trace)
ATHERIS_VERSION=3.0.0

limit=(-max_total_time=60)
what="60 s"
build_only=0
seeds=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) limit=(-runs="$2"); what="$2 inputs"; shift 2 ;;
    --seconds) limit=(-max_total_time="$2"); what="$2 s"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --seeds) seeds=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL[@]}")
for t in "${targets[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target $t (targets: ${ALL[*]})" >&2; exit 2; }
done

# The Python target's interpreter: Debian's python3 in a virtual environment with atheris (PyPI).
if [ ! -x "$BUILD/venv/bin/python" ] || ! "$BUILD/venv/bin/python" -c "import atheris" 2>/dev/null; then
  echo "[fuzz] creating $BUILD/venv with atheris $ATHERIS_VERSION"
  mkdir -p "$BUILD"
  /usr/bin/python3 -m venv "$BUILD/venv"
  "$BUILD/venv/bin/pip" install -q --disable-pip-version-check "atheris==$ATHERIS_VERSION"
fi
echo "[fuzz] building $BUILD (clang, -DC4_FUZZ=ON)"
mkdir -p "$BUILD"
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DC4_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" -j2 >"$BUILD/build.log" 2>&1 || { tail -50 "$BUILD/build.log"; exit 1; }
if [ "$seeds" = 1 ]; then
  "$BUILD/bin/fuzz_make_seeds" tests/fuzz/seeds
  "$BUILD/venv/bin/python" tests/fuzz/trace_fuzz.py --seeds tests/fuzz/seeds/trace
  echo "[fuzz] seeds written to tests/fuzz/seeds"
  exit 0
fi
[ "$build_only" = 1 ] && exit 0

mkdir -p "$BUILD/logs" "$BUILD/artifacts"
failed=()
summary=()
for t in "${targets[@]}"; do
  mkdir -p "$BUILD/corpus/$t" "tests/fuzz/seeds/$t" "tests/fuzz/regressions/$t"
  if [ "$t" = trace ]; then
    cmd=("$BUILD/venv/bin/python" tests/fuzz/trace_fuzz.py)
  else
    cmd=("$BUILD/bin/fuzz_$t")
  fi
  read -r -a opts <"$BUILD/fuzz-options/$t"
  log="$BUILD/logs/$t.log"
  echo "[fuzz] $t: $what: ${cmd[*]} ${opts[*]} ${limit[*]} $BUILD/corpus/$t tests/fuzz/seeds/$t tests/fuzz/regressions/$t"
  start=$(date +%s)
  set +e
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    "${cmd[@]}" "${opts[@]}" "${limit[@]}" -artifact_prefix="$BUILD/artifacts/$t-" \
    "$BUILD/corpus/$t" "tests/fuzz/seeds/$t" "tests/fuzz/regressions/$t" >"$log" 2>&1 &
  pid=$!
  # Progress: libFuzzer's latest status line once a minute.
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && echo "[fuzz] $t: $(grep -E '^#[0-9]+' "$log" | tail -1 | cut -c1-110)"
  done
  wait "$pid"
  rc=$?
  set -e
  secs=$(($(date +%s) - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)
  line=$(printf '%-16s %12s inputs %8s exec/s %6s s  %-22s %s' "$t" "${runs:-?}" "${eps:-?}" "$secs" "${cov:-}" \
    "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")")
  echo "[fuzz] $line"
  summary+=("$line")
  if [ $rc != 0 ]; then
    failed+=("$t")
    grep -E 'ERROR|SUMMARY|fuzz invariant|runtime error|Traceback|Error:|artifact_prefix|Test unit written' "$log" |
      head -20 | sed 's/^/[fuzz]   /'
  fi
done
echo "[fuzz] summary ($what each):"
printf '[fuzz]   %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "[fuzz] FAILED: ${failed[*]} (inputs in $BUILD/artifacts/, logs in $BUILD/logs/)" >&2
  exit 1
fi
