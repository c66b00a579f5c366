#!/usr/bin/env bash
# C4P's fabric service (c4-fabricd, docs/c4p.md "The fabric service") with three concurrent jobs on
# a second fabric where plans made alone collide: 6 hosts x 1 port, 2 leaves (h0-h2, h3-h5), 3
# spines; job A on h0/h3, B on h1/h4, C on h2/h5, each a 2-rank ring AllReduce over one lane, so each
# crosses the spines once each way. Every result is checked (c4-perf -c 1), and:
#   1. without the service, the three jobs plan the same spine (it carries nearly all their bytes);
#   2. with it, each job registering while the others are booked takes a spine of its own: each
#      spine carries one job;
#   3. jobs come and go: with three jobs running, one per spine, a fourth shares a spine with one
#      of them; once a job on another spine ends (killed: its lease runs out), the service asks one
#      of the two sharing jobs to move its lane to the freed spine (--move-interval-ms 0: at once),
#      which it does while it runs, every iteration right; then no spine carries two jobs.
#   run_fabric3.sh C4PERF C4FABRICD C4PLAN
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 3 ] || { echo "usage: $0 C4PERF C4FABRICD C4PLAN" >&2; exit 2; }
  netlab_enter --hosts 6 --ports 1 --leaves 2 --spines 3 --rate 1gbit -- "$0" "$@"
fi

perf=$1 fabricd=$2 c4plan=$3
tmp=$(mktemp -d)
daemon=""
trap fabric_cleanup EXIT
fabric_job_env
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
  --db "$tmp/fabric.db" --move-interval-ms 0 > "$tmp/fabricd.log" 2>&1 &
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

# 3. Jobs come and go. Each job runs until the test has seen what it checks (its iterations timed
# and checked one by one), then is stopped.
# The jobs on each spine, from the service's view: "spine0:NAME,NAME spine1:..." (job names end in their pid).
by_spine() {
  "$tools/netlab" run "$NETLAB_NAME" h5 -- "$c4plan" --service "$svc" --key-file "$tmp/key" --json | "$py" -c '
import json, sys
v = json.load(sys.stdin)
on = {}
for j in v["jobs"]:
    for l in j["lanes"]:
        on.setdefault(l["path"].split(" -> ")[2], set()).add(j["name"].split()[2].rstrip(":"))
print(" ".join("%s:%s" % (s, ",".join(sorted(n))) for s, n in sorted(on.items())))'
}
timeline=("$perf" -C allreduce -b 16M -e 16M -c 1 -w 1 -n 100000 --timeline 1)
export C4_PLANNER_LEASE_MS=1000
job_start run-x 29506 h0 h3 "${timeline[@]}"
wait_for "$tmp/run-x/out.0" "by the fabric service" "job X planned"
job_start run-y 29507 h1 h4 "${timeline[@]}"
wait_for "$tmp/run-y/out.0" "by the fabric service" "job Y planned"
job_start run-z 29508 h2 h5 "${timeline[@]}"
wait_for "$tmp/run-z/out.0" "by the fabric service" "job Z planned"
job_start run-w 29509 h0 h4 "${timeline[@]}"
wait_for "$tmp/run-w/out.0" "by the fabric service" "job W planned"
for j in run-x run-y run-z run-w; do wait_iters $j 2; done
echo "four jobs running: $(by_spine) (X on $(spine_of run-x), Y on $(spine_of run-y), Z on $(spine_of run-z), W on $(spine_of run-w))"
# A job on a spine W does not share ends; W or its neighbour moves there.
gone=""
for j in run-x run-y run-z; do
  [ "$(spine_of $j)" != "$(spine_of run-w)" ] && { gone=$j; break; }
done
[ -n "$gone" ] || { echo "FAIL: every job shares W's spine"; exit 1; }
freed=$(spine_of $gone)
moves_before=$(grep -c "move [0-9]* lane" "$tmp/fabricd.log" || true)
stop_job $gone
echo "stopped $gone (on $freed)"
wait_for "$tmp/fabricd.log" "expire .*most loaded" "the stopped job's lease running out"
for ((i = 0; ; i++)); do
  [ "$(grep -c "move [0-9]* lane" "$tmp/fabricd.log" || true)" -gt "$moves_before" ] && break
  [ $i -lt 1200 ] || { tail -20 "$tmp/fabricd.log"; echo "FAIL: the service moved no job to the freed spine"; exit 1; }
  sleep 0.1
done
grep "move [0-9]* lane" "$tmp/fabricd.log" | tail -1 | cut -c1-240
moved=""
for ((i = 0; i < 1200; i++)); do
  moved=$(grep -l "moved by the fabric service" "$tmp"/run-*/out.0 2> /dev/null | head -1 || true)
  [ -n "$moved" ] && break
  sleep 0.1
done
[ -n "$moved" ] || { echo "FAIL: no job moved its lane"; exit 1; }
grep -h "moved by the fabric service" "$moved" | head -1 | cut -c1-240
grep -q "moved by the fabric service to lane 1 (.*$freed" "$moved" || { echo "FAIL: the lane did not move to $freed"; exit 1; }
for ((i = 0; ; i++)); do
  view=$(by_spine)
  ! grep -q "," <<< "$view" && [ "$(wc -w <<< "$view")" = 3 ] && break
  [ $i -lt 1200 ] || { echo "$view"; echo "FAIL: a spine still carries two jobs"; exit 1; }
  sleep 0.1
done
echo "after the move: $view"
# The moved job goes on right over its new lane.
name=$(basename "$(dirname "$moved")")
wait_iters "$name" $(($(iters "$name") + 3))
for j in run-x run-y run-z run-w; do
  [ "$j" = "$gone" ] && continue
  stop_job $j
done
echo "PASS"
