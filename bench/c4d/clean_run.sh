#!/usr/bin/env bash
# C4D accuracy: a long clean run must produce no diagnosis at all (docs/performance.md, "C4D").
# Runs 4 ranks on this host through c4-perf (AllReduce, AllGather, ReduceScatter, 8 B to 64 MiB),
# one job after another, alternately over tcp and over shared memory, heartbeats every 200 ms (5x
# the default, so the detectors look 5x as often), until DURATION seconds have
# passed, with every rank appending to C4_DIAG_FILE; then counts the records.
#   bench/c4d/clean_run.sh C4PERF [DURATION_S=600]
# Prints progress (one line per job) and "false diagnoses: N"; exits 1 if N > 0 or a job failed.
set -euo pipefail
perf=${1:?usage: $0 C4PERF [DURATION_S]}
duration=${2:-600}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
job=0 fails=0 port=$((29700 + RANDOM % 200))
colls=(allreduce allgather reducescatter)
while [ $(($(date +%s) - start)) -lt "$duration" ]; do
  transport=$([ $((job % 2)) -eq 0 ] && echo tcp || echo auto)
  coll=${colls[$((job % 3))]}
  pids=()
  for r in 0 1 2 3; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + job % 50)) C4_TRANSPORT=$transport \
      C4_HEARTBEAT_MS=200 C4_DIAG_FILE="$tmp/diag.%r.jsonl" "$perf" -C "$coll" -b 8 -e 64M -f 8 -n 200 -w 2 -c 1 > "$tmp/out.$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
  job=$((job + 1))
  n=$( (cat "$tmp"/diag.*.jsonl 2>/dev/null || true) | wc -l)
  printf '[%4ds] job %d (%s over %s) done; diagnoses so far: %d\n' $(($(date +%s) - start)) "$job" "$coll" "$transport" "$n"
done
n=$( (cat "$tmp"/diag.*.jsonl 2>/dev/null || true) | wc -l)
[ "$n" -gt 0 ] && cat "$tmp"/diag.*.jsonl
echo "jobs: $job in $(($(date +%s) - start)) s, failed ranks: $fails, false diagnoses: $n"
[ "$n" -eq 0 ] && [ "$fails" -eq 0 ]
