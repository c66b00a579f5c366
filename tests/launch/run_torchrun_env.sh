#!/usr/bin/env bash
# Two c4-perf processes given torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT); the bootstrap root listens on MASTER_PORT+1.
set -euo pipefail
perf=$1
port=$(( 20000 + RANDOM % 20000 ))
export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r "$perf" -C allgather -b 8 -e 1M -f 32 -c 1 -n 2 -w 1 > "$tmp/out.$r" 2>&1 &
  pids[$r]=$!
done
rc=0
for r in 0 1; do wait "${pids[$r]}" || rc=1; done
cat "$tmp/out.0" "$tmp/out.1"
[ $rc -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$tmp/out.0"
