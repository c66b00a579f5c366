#!/usr/bin/env bash
# C4D's cost (docs/performance.md, "C4D"): AllReduce with the health checks on (the default) and off
# (C4_HEALTH=0), interleaved in one run so both see the same machine state. Telemetry is always on
# (it is part of every call); "off" removes the heartbeat thread, the side channel and the
# publication of rates. Each repetition runs c4-perf on 2 ranks for 8 B and 1 MiB, on shared
# memory and over tcp; prints per case the medians of on and off and their difference.
#   bench/c4d/overhead.sh C4PERF [REPS=7]
set -euo pipefail
perf=${1:?usage: $0 C4PERF [REPS]}
reps=${2:-7}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$((29400 + RANDOM % 200))
run() {  # run TRANSPORT BYTES ITERS HEALTH -> "time_us busbw" of rank 0 (out-of-place)
  local pids=() r
  port=$((port + 1))
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port C4_TRANSPORT=$1 C4_HEALTH=$4 \
      "$perf" -C allreduce -b "$2" -e "$2" -n "$3" -w 200 -c 0 > "$tmp/out.$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  awk '$1 ~ /^[0-9]+$/ && NF >= 8 {print $6, $8; exit}' "$tmp/out.0"
}
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
printf '%-6s %-8s %14s %14s %12s\n' transport size "health on" "health off" "on - off"
for tr in auto tcp; do
  # Each run lasts about 2-3 s: several heartbeat periods (C4_HEARTBEAT_MS, 1 s by default).
  if [ "$tr" = auto ]; then cases=("8 5000000 us" "1048576 20000 busbw"); else cases=("8 500000 us" "1048576 10000 busbw"); fi
  for case in "${cases[@]}"; do
    set -- $case
    : > "$tmp/on"; : > "$tmp/off"
    for ((i = 0; i < reps; i++)); do
      for h in 1 0; do
        v=$(run "$tr" "$1" "$2" "$h")
        if [ "$3" = us ]; then echo "$v" | awk '{print $1}'; else echo "$v" | awk '{print $2}'; fi >> "$tmp/$([ $h = 1 ] && echo on || echo off)"
      done
      printf '.' >&2
    done
    on=$(median < "$tmp/on") off=$(median < "$tmp/off")
    if [ "$3" = us ]; then
      printf '\r%-6s %-8s %11.2f us %11.2f us %9.2f us\n' "$tr" 8B "$on" "$off" "$(awk -v a="$on" -v b="$off" 'BEGIN {print a - b}')"
    else
      printf '\r%-6s %-8s %9.3f GB/s %9.3f GB/s %10.2f %%\n' "$tr" 1MiB "$on" "$off" "$(awk -v a="$on" -v b="$off" 'BEGIN {print (a - b) * 100 / b}')"
    fi
  done
done
