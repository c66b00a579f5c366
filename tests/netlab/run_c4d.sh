#!/usr/bin/env bash
# C4D on an emulated fabric (docs/c4d.md): the side channel (bootstrap, heartbeats) runs on port p0
# of every host, the data on port p1 (C4_TCP_PORTS=p1), so a fault on a p1 link leaves the health
# checks standing, as a separate management network would.
#   throttle: 4 hosts, ring AllReduce 16 MiB in a loop; after a few iterations the link h2p1-leaf1
#             is slowed to 10% (100 Mbit/s of 1 Gbit/s). Within 30 s some rank's C4_DIAG_FILE
#             must hold a comm_slow record naming rank 2 and its host (h2's address), and no other
#             class. Prints the seconds from the throttle to the record.
#   cut:      2 hosts, one lane, no planner (no failover path); the link h1p1-leaf1 goes down
#             mid-run. Both ranks must fail within C4_TIMEOUT + 5 s with a comm_hang that names
#             the link between rank 0 and rank 1 (never a dead rank: both are alive).
#   clean:    4 hosts, no fault, for C4D_CLEAN_S seconds (default 20): no diagnosis at all.
#   run_c4d.sh C4PERF throttle|cut|clean
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
[ -n "${C4_TEST_TRACE:-}" ] && set -x
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 C4PERF throttle|cut|clean" >&2; exit 2; }
  netlab_enter --hosts "$([ "$2" = cut ] && echo 2 || echo 4)" --ports 2 --leaves 2 --spines 2 --rate 1gbit \
    -- "$0" "$@"
fi

perf=$1 fault=$2
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${C4_TEST_KEEP:-}" ] && cp -r "$tmp" "$C4_TEST_KEEP"
  rm -rf "$tmp"
}
trap cleanup EXIT
hosts=$([ "$fault" = cut ] && echo 2 || echo 4)
master=$("$tools/netlab" addr "$NETLAB_NAME" h0)
# cut: the hang must be found fast; throttle: TCP on a link cut to 10% recovers its losses with
# retransmission timeouts of seconds, which is slow, not stuck.
timeout_s=$([ "$fault" = cut ] && echo 4 || echo 60)
for ((r = 0; r < hosts; r++)); do
  "$tools/netlab" run "$NETLAB_NAME" "h$r" -- env RANK=$r LOCAL_RANK=0 WORLD_SIZE=$hosts MASTER_ADDR="$master" \
    MASTER_PORT=29500 C4_SOCKET_IFNAME=p0 C4_TCP_PORTS=p1 C4_LANES=1 C4_PLANNER=off C4_ALGO=ring \
    C4_TIMEOUT=$timeout_s C4_HEARTBEAT_MS=500 C4_DIAG_FILE="$tmp/diag.%r.jsonl" C4_DEBUG=INFO C4_DEBUG_SUBSYS=NET \
    "$perf" -C allreduce -b 16M -e 16M -n 100000 -w 1 -c 1 > "$tmp/out.$r" 2>&1 &
  pids+=($!)
done
# A few iterations first: the receive rates of the fast fabric.
sleep 6
for ((r = 0; r < hosts; r++)); do
  kill -0 "${pids[$r]}" 2>/dev/null || { echo "FAIL: rank $r ended before the fault:"; cat "$tmp/out.$r"; exit 1; }
done
if [ -n "$(cat "$tmp"/diag.*.jsonl 2>/dev/null)" ]; then
  echo "FAIL: diagnoses before the fault:"; cat "$tmp"/diag.*.jsonl; exit 1
fi
t0=$(date +%s%N)
rc=0
if [ "$fault" = clean ]; then
  clean_s=${C4D_CLEAN_S:-20}
  for ((i = 0; i < clean_s; i++)); do
    sleep 1
    for ((r = 0; r < hosts; r++)); do
      kill -0 "${pids[$r]}" 2>/dev/null || { echo "FAIL: rank $r ended:"; tail -5 "$tmp/out.$r"; exit 1; }
    done
    [ $((i % 30)) -eq 29 ] && echo "[$((i + 1)) s] diagnoses: $( (cat "$tmp"/diag.*.jsonl 2>/dev/null || true) | wc -l)"
  done
  n=$( (cat "$tmp"/diag.*.jsonl 2>/dev/null || true) | wc -l)
  [ "$n" -eq 0 ] || { echo "FAIL: $n false diagnoses:"; cat "$tmp"/diag.*.jsonl; rc=1; }
  grep -h "C4D receive rates" "$tmp"/out.0 | tail -1
  echo "C4D-FIGURE clean-run-s $((clean_s + 6)) false-diagnoses $n"
elif [ "$fault" = throttle ]; then
  "$tools/netlab" link "$NETLAB_NAME" h2p1-leaf1 --rate 100mbit
  h2=$("$tools/netlab" addr "$NETLAB_NAME" h2)
  found=""
  for _ in $(seq 1 300); do
    found=$(cat "$tmp"/diag.*.jsonl 2>/dev/null | grep '"class":"comm_slow"' | head -1) || true
    [ -n "$found" ] && break
    sleep 0.1
  done
  took=$((($(date +%s%N) - t0) / 1000000))
  [ -n "$found" ] || { echo "FAIL: no comm_slow record within 30 s of the throttle"; cat "$tmp"/diag.*.jsonl 2>/dev/null; rc=1; }
  grep -h "C4D receive rates" "$tmp"/out.* | tail -4
  if [ -n "$found" ]; then
    echo "comm_slow after $took ms: $found"
    echo "$found" | grep -q '"ranks":\[[^]]*2' || { echo "FAIL: rank 2 not among the culprits"; rc=1; }
    echo "$found" | grep -q "@$h2\"" || { echo "FAIL: host h2 ($h2) not named"; rc=1; }
  fi
  other=$(cat "$tmp"/diag.*.jsonl | grep -v '"class":"comm_slow"') || true
  [ -z "$other" ] || { echo "FAIL: other diagnoses: $other"; rc=1; }
  echo "C4D-FIGURE throttle-to-record-ms $took"
else
  "$tools/netlab" link "$NETLAB_NAME" h1p1-leaf1 --down
  for ((r = 0; r < hosts; r++)); do
    for ((i = 0; i < 10 * (timeout_s + 20); i++)); do
      kill -0 "${pids[$r]}" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "${pids[$r]}" 2>/dev/null; then echo "FAIL: rank $r still running: hang"; rc=1; fi
  done
  took=$((($(date +%s%N) - t0) / 1000000))
  for ((r = 0; r < hosts; r++)); do
    echo "--- rank $r"; grep -E "C4D|error" "$tmp/out.$r" | tail -3
    grep -q "\[C4D comm_hang" "$tmp/out.$r" || { echo "FAIL: rank $r's error has no comm_hang"; rc=1; }
    rec=$(grep '"class":"comm_hang"' "$tmp/diag.$r.jsonl" 2>/dev/null | head -1) || true
    echo "$rec" | grep -q '"links":\[\[0,1\]\]' || { echo "FAIL: rank $r has no record naming the link 0-1: $rec"; rc=1; }
    if grep -q '"class":"dead_rank"' "$tmp/diag.$r.jsonl" 2>/dev/null; then echo "FAIL: rank $r saw a dead rank"; rc=1; fi
  done
  echo "C4D-FIGURE cut-to-failure-ms $took (C4_TIMEOUT=${timeout_s} s)"
  [ "$took" -le $(((timeout_s + 5) * 1000)) ] || { echo "FAIL: took $took ms, more than C4_TIMEOUT + 5 s"; rc=1; }
fi
exit $rc
