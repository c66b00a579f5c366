#!/usr/bin/env bash
# C4P's fabric service (c4-fabricd, docs/c4p.md "The fabric service") with three concurrent jobs on
# a second fabric where plans made alone collide: 6 hosts x 1 port, 2 leaves (h0-h2, h3-h5), 3
# spines; job A on h0/h3, B on h1/h4, C on h2/h5, each a 2-rank ring AllReduce over one lane, so each
# crosses the spines once each way. Every result is checked (c4-perf -c 1), and:
#   1. without the service, the three jobs plan the same spine (it carries nearly all their bytes);
#   2. with it, each job registering while the others are booked takes a spine of its own: each
#      spine carries one job.
#   run_fabric3.sh C4PERF C4FABRICD
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 C4PERF C4FABRICD" >&2; exit 2; }
  netlab_enter --hosts 6 --ports 1 --leaves 2 --spines 3 --rate 1gbit -- "$0" "$@"
fi

perf=$1 fabricd=$2
tmp=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
export C4_PLANNER=c4p C4_TOPO_FILE=$NETLAB_TOPO C4_LANES=1 C4_ALGO=ring C4_TIMEOUT=${C4_TIMEOUT:-60} \
  C4_DEBUG=INFO C4_DEBUG_SUBSYS=PLAN C4_REBALANCE_MS=0
ring=("$perf" -C allreduce -b 16M -e 16M -c 1 -w 1)
# share S PART...: whether PART is at least S% of the sum of the parts given after it (the first).
share() {
  local s=$1 part=$2 sum=0 x
  shift 2
  for x in "$@"; do sum=$((sum + x)); done
  [ $((part * 100)) -ge $((sum * s)) ]
}

# 1. Planned alone, the three jobs collide on one spine.
before=($(spine_bytes))
job_start alone-a 29500 h0 h3 "${ring[@]}" -n 8
job_start alone-b 29501 h1 h4 "${ring[@]}" -n 8
job_start alone-c 29502 h2 h5 "${ring[@]}" -n 8
for j in alone-a alone-b alone-c; do job_wait $j; done
after=($(spine_bytes))
d=($((after[0] - before[0])) $((after[1] - before[1])) $((after[2] - before[2])))
echo "planned alone: A on $(spine_of alone-a), B on $(spine_of alone-b), C on $(spine_of alone-c); spine bytes ${d[*]}"
[ "$(spine_of alone-a)" = "$(spine_of alone-b)" ] && [ "$(spine_of alone-b)" = "$(spine_of alone-c)" ] ||
  { echo "FAIL: the jobs planned alone did not collide"; exit 1; }
busiest=0
for x in "${d[@]}"; do [ "$x" -gt "$busiest" ] && busiest=$x; done
share 80 "$busiest" "${d[@]}" || { echo "FAIL: the spine counters do not show the collision"; exit 1; }

# The service, in h0's namespace; the key only its owner reads.
head -c 32 /dev/urandom | base64 > "$tmp/key"
chmod 600 "$tmp/key"
svc="$(addr h0):7471"
"$tools/netlab" run "$NETLAB_NAME" h0 -- "$fabricd" --topo "$NETLAB_TOPO" --key-file "$tmp/key" --listen "$svc" \
  --db "$tmp/fabric.db" > "$tmp/fabricd.log" 2>&1 &
daemon=$!
wait_for "$tmp/fabricd.log" "listening" "the service starting"
export C4_PLANNER_SERVICE=$svc C4_PLANNER_KEY_FILE=$tmp/key

# 2. A registers, then B while A is booked, then C while both are: each is held (SIGSTOP, long lease)
# from its registration until C has run, so that the books hold them however slow the machine is.
before=($(spine_bytes))
job_start with-a 29503 h0 h3 C4_PLANNER_LEASE_MS=600000 "${ring[@]}" -n 20
wait_for "$tmp/with-a/out.0" "by the fabric service" "job A planned by the service"
kill -STOP $(cat "$tmp/with-a/pids")
job_start with-b 29504 h1 h4 C4_PLANNER_LEASE_MS=600000 "${ring[@]}" -n 20
wait_for "$tmp/with-b/out.0" "by the fabric service" "job B planned by the service"
kill -STOP $(cat "$tmp/with-b/pids")
job_start with-c 29505 h2 h5 "${ring[@]}" -n 20
job_wait with-c
kill -CONT $(cat "$tmp/with-a/pids") $(cat "$tmp/with-b/pids")
job_wait with-a
job_wait with-b
after=($(spine_bytes))
d=($((after[0] - before[0])) $((after[1] - before[1])) $((after[2] - before[2])))
grep -q "by the fabric service" "$tmp/with-c/out.0" || { cat "$tmp/with-c/out.0"; echo "FAIL: C not planned by the service"; exit 1; }
echo "with the service: A on $(spine_of with-a), B on $(spine_of with-b), C on $(spine_of with-c); spine bytes ${d[*]}"
[ "$(printf '%s\n' "$(spine_of with-a)" "$(spine_of with-b)" "$(spine_of with-c)" | sort -u | wc -l)" = 3 ] ||
  { echo "FAIL: the service put two jobs on one spine"; exit 1; }
for x in "${d[@]}"; do share 20 "$x" "${d[@]}" || { echo "FAIL: a spine carried almost nothing"; exit 1; }; done
wait_for "$tmp/fabricd.log" "release" "the jobs' releases"
echo "PASS"
