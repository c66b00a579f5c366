#!/usr/bin/env bash
# Synthesized schedules on an emulated fabric with mixed link rates (docs/schedules.md):
# 4 hosts on 2 leaves, 2 spines, host links 4x the leaf-spine links. c4-synth reads the fabric's
# topology file and writes AllGather, AllReduce and AllToAll schedules for it; c4-perf runs them over tcp with
# C4_TOPO_FILE and C4_SCHEDULE_FILE on every rank. Results must be right, every rank's log must show
# the synthesized schedule in use, and a ring run beside it gives the ratio (printed, not asserted:
# the performance figures are bench/synth/netlab.sh's; AllToAll's is against direct, the only generated one).
#   run_synth.sh C4PERF C4SYNTH
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 C4PERF C4SYNTH" >&2; exit 2; }
  netlab_enter --hosts 4 --ports 1 --leaves 2 --spines 2 --host-rate 400mbit --uplink-rate 100mbit -- "$0" "$@"
fi

perf=$1 synth=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for coll in allgather allreduce alltoall; do
  "$synth" --topo "$NETLAB_TOPO" --coll $coll --chunks 2 --time-limit 60 --out "$tmp/$coll.json" ||
    { echo "FAIL: c4-synth --coll $coll"; exit 1; }
done
export C4_TIMEOUT=${C4_TIMEOUT:-90} C4_TOPO_FILE="$NETLAB_TOPO"
for coll in allgather allreduce alltoall; do
  gen=ring
  [ $coll = alltoall ] && gen=direct
  for mode in file $gen; do
    out="$tmp/$coll-$mode"
    mkdir -p "$out"
    if [ $mode = file ]; then
      set -- C4_SCHEDULE_FILE="$tmp/allgather.json,$tmp/allreduce.json,$tmp/alltoall.json" C4_DEBUG=INFO \
        C4_DEBUG_SUBSYS=TUNING,PLAN
    else
      set -- C4_ALGO=$gen
    fi
    netlab_run_ranks 4 1 "$out" "$@" "$perf" -C $coll -b 64K -e 4M -f 8 -c 1 -n 2 -w 1 ||
      { echo "FAIL: $coll with $mode"; exit 1; }
    grep -q "Out of bounds values : 0 OK" "$out/out.0" || { cat "$out/out.0"; echo "FAIL: $coll $mode: wrong results"; exit 1; }
    if [ $mode = file ]; then
      name=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$tmp/$coll.json")
      for r in 0 1 2 3; do
        grep -q "algorithm file:$name" "$out/out.$r" ||
          { cat "$out/out.$r"; echo "FAIL: rank $r did not run the synthesized $coll ($name)"; exit 1; }
      done
      # C4P plans every connection the three files use (not only the AllReduce's): the rank pairs
      # that exchange messages in any of them.
      want=$("$py" - "$tmp"/allgather.json "$tmp"/allreduce.json "$tmp"/alltoall.json <<'PYEOF'
import json, sys
pairs = set()
for f in sys.argv[1:]:
    for r, rank in enumerate(json.load(open(f))["ranks"]):
        pairs.update(frozenset((r, s["peer"])) for s in rank["steps"])
print(len(pairs))
PYEOF
)
      grep -q "C4P c4p over .*: $want connection(s) x .* and 2 schedule file(s)" "$out/out.0" ||
        { grep "C4P" "$out/out.0"; echo "FAIL: C4P did not plan the $want connections the schedule files use"; exit 1; }
    fi
    echo "$coll $mode: results right; 4 MiB algbw $(awk '$1 == 4194304 {print $7 " GB/s"}' "$out/out.0")"
  done
done
echo "PASS: synthesized AllGather, AllReduce and AllToAll ran right on the fabric"
