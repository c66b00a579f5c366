#!/usr/bin/env bash
# C4P under a fabric fault, mid-run: 4 hosts x 2 NIC ports, 2 leaves, 2 spines, links 1 Gbit/s, one
# rank per host on both ports, ring AllReduce 16 MiB, every iteration timed and checked
# (c4-perf --timeline 1 -c 1). After the first iterations the uplink leaf0-spine1 is
#   throttle: slowed to 25%: the lanes through it must get a smaller striping weight (measured
#             throughput) on both ranks that send through it;
#   cut:      black-holed: the lanes through it are retired (one warning each naming the lane and
#             its path through spine1), replaced by lanes through spine0, and every iteration,
#             the one running during the cut included, must give right results.
#   spare:    (3 spines; the plan leaves one spare) the uplink that a lane of rank 1's connection
#             to rank 2 crosses is slowed to 25%: the lanes through it are moved onto the spare
#             spine (rank 1 and rank 0 open the two cross-leaf connections).
#   run_c4p_fault.sh C4PERF throttle|cut|spare
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
[ -n "${C4_TEST_TRACE:-}" ] && set -x
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 C4PERF throttle|cut|spare" >&2; exit 2; }
  netlab_enter --hosts 4 --ports 2 --leaves 2 --spines "$([ "$2" = spare ] && echo 3 || echo 2)" --rate 1gbit \
    -- "$0" "$@"
fi

perf=$1 fault=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export C4_TCP_PORTS=p0,p1 C4_LANES=2 C4_ALGO=ring C4_TIMEOUT=${C4_TIMEOUT:-60} C4_DEBUG=INFO C4_DEBUG_SUBSYS=PLAN,NET
netlab_run_ranks 4 1 "$tmp" C4_PLANNER=c4p "$perf" -C allreduce -b 16M -e 16M -c 1 -n 40 -w 1 --timeline 1 &
runner=$!
# The fault once the ranks have run a few iterations (rank 0 prints each).
for _ in $(seq 1 300); do
  n=$(grep -c 'iteration' "$tmp/out.0" 2>/dev/null) || n=0
  [ "$n" -ge 4 ] && break
  sleep 0.1
done
if [ "$fault" = throttle ]; then
  "$tools/netlab" link "$NETLAB_NAME" leaf0-spine1 --rate 250mbit
elif [ "$fault" = spare ]; then
  spine=$(grep -m1 -o "rank 1 <-> rank 2 lane 0: .* via spine[0-9]" "$tmp/out.0" | grep -o "spine[0-9]$") ||
    { echo "FAIL: no plan logged for rank 1 <-> rank 2"; exit 1; }
  echo "slowing leaf0-$spine (rank 1's lane 0 to rank 2 crosses it)"
  "$tools/netlab" link "$NETLAB_NAME" "leaf0-$spine" --rate 250mbit
else
  "$tools/netlab" link "$NETLAB_NAME" leaf0-spine1 --down
fi
echo "fault ($fault) after $(grep -c 'iteration' "$tmp/out.0") iterations"
wait $runner || { echo "FAIL: a rank failed"; exit 1; }
grep "iteration" "$tmp/out.0" | awk '{printf "%s %s  ", $5, $11} END {print ""}'
for r in 0 1 2 3; do
  grep -q "WRONG" "$tmp/out.$r" && { echo "FAIL: rank $r saw wrong results"; exit 1; }
done
grep -q "Out of bounds values : 0 OK" "$tmp/out.0" || { echo "FAIL: wrong results"; exit 1; }
[ "$(grep -c 'iteration.*right' "$tmp/out.0")" -ge 40 ] || { echo "FAIL: iterations missing"; exit 1; }
if [ "$fault" = throttle ]; then
  # Ranks 1 and 3 send through the throttled link (1 -> 2 up leaf0 -> spine1, 3 -> 0 down spine1 ->
  # leaf0); their lane through spine1 must have lost weight.
  for r in 1 3; do
    grep "lane weights" "$tmp/out.$r" | tail -1
    grep "lane weights" "$tmp/out.$r" | tail -1 | grep -Eq 'weights to rank [0-9]+: (1\.00 0\.[0-4][0-9]|0\.[0-4][0-9] 1\.00) ' ||
      { echo "FAIL: rank $r did not shift its traffic off the throttled lane"; cat "$tmp/out.$r" | tail -20; exit 1; }
  done
elif [ "$fault" = spare ]; then
  # Rank 1 sends 1 -> 2 over the slowed uplink and opens that connection's lanes: it moves the lane.
  # Rank 3 sends 3 -> 0 back through it but rank 0 opens the lanes: rank 3 retires the lane and
  # rank 0 replaces it, avoiding the slowed links: through the spare spine.
  grep -h "spare path\|replaces it" "$tmp/out.1" "$tmp/out.3" "$tmp/out.0" | cut -c1-220 || true
  grep -q "moved to a spare path" "$tmp/out.1" || { echo "FAIL: rank 1 moved no lane to the spare spine"; exit 1; }
  grep -q "retired for the peer to replace on a spare path" "$tmp/out.3" ||
    { echo "FAIL: rank 3 did not retire its slow lane"; exit 1; }
  grep "replaces it (" "$tmp/out.0" | grep -qv "replaces it (.*$spine" ||
    { echo "FAIL: rank 0 did not replace the lane away from $spine"; exit 1; }
else
  for r in 1 3; do
    grep "retires" "$tmp/out.$r" | head -1
    grep -q "retires .*path .*spine1" "$tmp/out.$r" || { echo "FAIL: rank $r retired no lane through spine1"; exit 1; }
  done
  for r in 0 1; do  # the openers of the two cross-leaf connections
    grep "replaces it" "$tmp/out.$r" | head -1
    grep -q "replaces it (.*spine0" "$tmp/out.$r" || { echo "FAIL: rank $r replaced no lane via spine0"; exit 1; }
  done
fi
echo "PASS"
