#!/usr/bin/env bash
# A link cut in the middle of a collective: two emulated hosts run a long AllReduce loop, then the
# link of host 1 goes down (every packet dropped; TCP sees silence, no reset). Both ranks must fail
# within C4_TIMEOUT with an error that names the peer they lost, never hang, never report wrong data.
#   run_linkcut.sh C4PERF
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 1 ] || { echo "usage: $0 C4PERF" >&2; exit 2; }
  netlab_enter --hosts 2 --ports 1 --leaves 2 --spines 2 --rate 1gbit -- "$0" "$@"
fi

perf=$1
timeout_s=4
master=$("$tools/netlab" addr "$NETLAB_NAME" h0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
for r in 0 1; do
  "$tools/netlab" run "$NETLAB_NAME" "h$r" -- env RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR="$master" \
    MASTER_PORT=29500 C4_SOCKET_IFNAME=p0 C4_TIMEOUT=$timeout_s \
    "$perf" -C allreduce -b 8M -e 8M -n 100000 -w 1 -c 1 > "$tmp/out.$r" 2>&1 &
  pids+=($!)
done
sleep 2
for r in 0 1; do
  kill -0 "${pids[$r]}" 2>/dev/null || { echo "rank $r ended before the cut:"; cat "$tmp/out.$r"; exit 1; }
done
cut=$(date +%s%N)
"$tools/netlab" link "$NETLAB_NAME" h1p0-leaf1 --down
rc=0
for r in 0 1; do
  # No hang: each rank must be gone well within the timeout (plus slack for this 2-core machine).
  for ((i = 0; i < 10 * (timeout_s + 20); i++)); do
    kill -0 "${pids[$r]}" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "${pids[$r]}" 2>/dev/null; then
    echo "rank $r still running: hang"; for p in $(pgrep -f "c4-perf -C allreduce -b 8M"); do echo "== pid $p"; gdb -p $p -batch -ex "thread apply all bt" 2>/dev/null | grep -E "^#|^Thread" | head -60; done; kill -9 "${pids[$r]}"; rc=1
  fi
  if wait "${pids[$r]}"; then
    echo "rank $r exited 0 after its peer's link was cut"; rc=1
  fi
done
took_ms=$((($(date +%s%N) - cut) / 1000000))
for r in 0 1; do
  peer=$((1 - r))
  echo "--- rank $r"; grep -E "rank|error|Error" "$tmp/out.$r" | tail -4
  grep -q "rank $peer" "$tmp/out.$r" || { echo "rank $r's error does not name rank $peer"; rc=1; }
  if grep -qE "Out of bounds values : [1-9]" "$tmp/out.$r"; then echo "rank $r reported wrong results"; rc=1; fi
done
echo "both ranks failed within ${took_ms} ms of the cut (C4_TIMEOUT=${timeout_s} s)"
exit $rc
