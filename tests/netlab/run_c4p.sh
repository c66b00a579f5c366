#!/usr/bin/env bash
# C4P across emulated hosts: 4 hosts x 2 NIC ports, 2 leaves, 2 spines, links 1 Gbit/s, one rank per
# host, both ports in use (C4_TCP_PORTS=p0,p1, 2 lanes). AllReduce results must be right with every
# planner (c4p, ecmp, off); with c4p the plan must be logged, and a ring AllReduce's cross-leaf
# lanes must be spread over both spines (spine byte counters within 35/65 of each other): what the
# planner decided is what the fabric carried.
#   run_c4p.sh C4PERF
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 1 ] || { echo "usage: $0 C4PERF" >&2; exit 2; }
  netlab_enter --hosts 4 --ports 2 --leaves 2 --spines 2 --rate 1gbit -- "$0" "$@"
fi

perf=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export C4_TCP_PORTS=p0,p1 C4_LANES=2 C4_TIMEOUT=${C4_TIMEOUT:-60} C4_DEBUG=INFO C4_DEBUG_SUBSYS=PLAN
for mode in c4p ecmp off; do
  mkdir -p "$tmp/$mode"
  netlab_run_ranks 4 1 "$tmp/$mode" C4_PLANNER=$mode C4_PLAN_SEED=2 "$perf" -C allreduce -b 8 -e 4M -f 8 -c 1 -n 2 -w 1 ||
    { echo "FAIL: C4_PLANNER=$mode"; exit 1; }
  grep -q "Out of bounds values : 0 OK" "$tmp/$mode/out.0" || { cat "$tmp/$mode/out.0"; echo "FAIL: $mode: wrong results"; exit 1; }
  if [ $mode != off ]; then
    grep -q "C4P $mode over $NETLAB_TOPO" "$tmp/$mode/out.0" || { cat "$tmp/$mode/out.0"; echo "FAIL: no $mode plan logged"; exit 1; }
  fi
  echo "C4_PLANNER=$mode: results right"
done
grep -A9 "C4P plan" "$tmp/c4p/out.0" || true

# Bad input fails init on every rank, with the entry named, and nothing hangs: a file with a link
# of zero capacity, a file of another fabric, and an unknown planner.
"$py" - "$NETLAB_TOPO" "$tmp" "$tools" <<'PYEOF'
import json, sys
sys.path.insert(0, sys.argv[3])
import netlab
topo = json.load(open(sys.argv[1]))
topo["links"][3]["rate_bps"] = 0
json.dump(topo, open(sys.argv[2] + "/zero.json", "w"))
other = netlab.build_topology("other", hosts=4, ports=2, leaves=2, spines=2, octet=250)
json.dump(other, open(sys.argv[2] + "/other.json", "w"))
PYEOF
bad_init() {  # label expected-text env...
  local label=$1 want=$2
  shift 2
  mkdir -p "$tmp/bad-$label"
  if netlab_run_ranks 4 1 "$tmp/bad-$label" "$@" timeout 60 "$perf" -C allreduce -b 8 -e 8 -n 1 -w 0 > /dev/null; then
    echo "FAIL: $label: init succeeded"; exit 1
  fi
  for r in 0 1 2 3; do
    grep -q -- "$want" "$tmp/bad-$label/out.$r" || { cat "$tmp/bad-$label/out.$r"; echo "FAIL: $label: rank $r"; exit 1; }
  done
  echo "$label: every rank failed init: $(grep -m1 -o -- "$want.*" "$tmp/bad-$label/out.0" | cut -c1-150)"
}
bad_init zero-capacity "links\[3\].*rate_bps = 0" C4_TOPO_FILE="$tmp/zero.json"
bad_init other-fabric "lists no port with address" C4_TOPO_FILE="$tmp/other.json"
bad_init planner "C4_PLANNER=bogus" C4_PLANNER=bogus

# Ring AllReduce with c4p: the two cross-leaf connections (1->2, 3->0) have two lanes each; a plan
# puts one lane of each on each spine.
before=($(spine_bytes))
mkdir -p "$tmp/ring"
netlab_run_ranks 4 1 "$tmp/ring" C4_PLANNER=c4p C4_ALGO=ring C4_TRACE_DIR="$tmp/trace" C4_REBALANCE_MS=1 \
  "$perf" -C allreduce -b 16M -e 16M -c 1 -n 4 -w 1 || { echo "FAIL: ring AllReduce with c4p"; exit 1; }
after=($(spine_bytes))
s0=$((after[0] - before[0])) s1=$((after[1] - before[1]))
echo "spine bytes during the ring AllReduce with c4p: spine0 $s0, spine1 $s1"
grep -A9 "C4P plan" "$tmp/ring/out.0" || true
[ $((s0 + s1)) -ge $((16 * 1024 * 1024)) ] || { echo "FAIL: the ring did not cross the spines"; exit 1; }
[ $((s0 * 100)) -ge $(((s0 + s1) * 35)) ] && [ $((s1 * 100)) -ge $(((s0 + s1) * 35)) ] ||
  { echo "FAIL: c4p's lanes are not spread over the spines"; exit 1; }
# The trace has the plan and what the lanes carried through the spines (c4-trace's C4P section).
"$py" "$here/../../tools/c4-trace/c4-trace" summary "$tmp/trace" > "$tmp/summary.txt" 2>&1 ||
  { cat "$tmp/summary.txt"; echo "FAIL: c4-trace"; exit 1; }
sed -n '/^C4P/,/^$/p' "$tmp/summary.txt"
grep -q "C4P c4p over $NETLAB_TOPO" "$tmp/summary.txt" || { echo "FAIL: no plan event in the trace"; exit 1; }
grep -Eq "leaf0->spine0 +switch" "$tmp/summary.txt" && grep -Eq "leaf0->spine1 +switch" "$tmp/summary.txt" ||
  { echo "FAIL: no lane samples through both spines in the trace"; exit 1; }
echo "PASS"
