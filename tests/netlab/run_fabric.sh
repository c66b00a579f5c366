#!/usr/bin/env bash
# C4P's fabric service (c4-fabricd, docs/c4p.md "The fabric service") with concurrent jobs on an
# emulated fabric where plans made alone collide: 4 hosts x 1 port, 2 leaves, 2 spines; job A on
# h0/h2, job B on h1/h3, each a 2-rank ring AllReduce over one lane, so each crosses the spines
# once each way. Every result is checked (c4-perf -c 1), and:
#   1. without the service, both jobs plan spine 0 (their cross-spine bytes all on one spine);
#   2. with it, B (starting while A runs) is placed on the other spine: each spine carries one job;
#   3. a job killed mid-run: its lease expires at the service and the next job takes its spine;
#   4. an uplink throttled under two running jobs, each with two lanes (one through each spine):
#      job A measures its lane through it slow and tells the service, which books the link slow and
#      moves both jobs' lanes off it (job B does not look at its lanes itself: C4_REBALANCE_MS=0);
#      the spine then carries nothing, and every iteration's result is right;
#   5. the service killed mid-run: the running job goes on and ends right; a job that starts after
#      it plans alone with a warning, and its init does not hang.
# And `c4-plan --service` (from another host) shows the running job and its lane's path.
#   run_fabric.sh C4PERF C4FABRICD C4PLAN
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 3 ] || { echo "usage: $0 C4PERF C4FABRICD C4PLAN" >&2; exit 2; }
  netlab_enter --hosts 4 --ports 1 --leaves 2 --spines 2 --rate 1gbit -- "$0" "$@"
fi

perf=$1 fabricd=$2 c4plan=$3
tmp=$(mktemp -d)
daemon=""
trap fabric_cleanup EXIT
fabric_job_env
ring=("$perf" -C allreduce -b 16M -e 16M -c 1 -w 1)

# 1. Planned alone, the two jobs collide on one spine.
before=($(spine_bytes))
job_start alone-a 29500 h0 h2 "${ring[@]}" -n 8
job_start alone-b 29501 h1 h3 "${ring[@]}" -n 8
job_wait alone-a
job_wait alone-b
after=($(spine_bytes))
s0=$((after[0] - before[0])) s1=$((after[1] - before[1]))
echo "planned alone: A on $(spine_of alone-a), B on $(spine_of alone-b); spine bytes $s0 / $s1"
[ "$(spine_of alone-a)" = "$(spine_of alone-b)" ] || { echo "FAIL: the jobs planned alone did not collide"; exit 1; }
split $s0 $s1 35 && { echo "FAIL: the spine counters do not show the collision"; exit 1; }

# The service, in h0's namespace on h0's address; the key only its owner reads.
head -c 32 /dev/urandom | base64 > "$tmp/key"
chmod 600 "$tmp/key"
svc="$(addr h0):7471"
"$tools/netlab" run "$NETLAB_NAME" h0 -- "$fabricd" --topo "$NETLAB_TOPO" --key-file "$tmp/key" --listen "$svc" \
  --db "$tmp/fabric.db" --min-lease-ms 500 > "$tmp/fabricd.log" 2>&1 &
daemon=$!
wait_for "$tmp/fabricd.log" "listening" "the service starting"
export C4_PLANNER_SERVICE=$svc C4_PLANNER_KEY_FILE=$tmp/key C4_PLANNER_LEASE_MS=1000

# 2. B starts while A runs; the service puts it on the other spine. A is held (SIGSTOP, with a long
# lease) from its registration until B has run, so that it is booked when B registers however slow
# the machine is; then it goes on and ends.
before=($(spine_bytes))
job_start with-a 29502 h0 h2 C4_PLANNER_LEASE_MS=600000 "${ring[@]}" -n 40
wait_for "$tmp/with-a/out.0" "by the fabric service" "job A planned by the service"
kill -STOP $(cat "$tmp/with-a/pids")
job_start with-b 29503 h1 h3 "${ring[@]}" -n 20
job_wait with-b
kill -CONT $(cat "$tmp/with-a/pids")
job_wait with-a
after=($(spine_bytes))
s0=$((after[0] - before[0])) s1=$((after[1] - before[1]))
grep -q "by the fabric service" "$tmp/with-b/out.0" || { cat "$tmp/with-b/out.0"; echo "FAIL: B not planned by the service"; exit 1; }
echo "with the service: A on $(spine_of with-a), B on $(spine_of with-b); spine bytes $s0 / $s1"
[ "$(spine_of with-a)" != "$(spine_of with-b)" ] || { echo "FAIL: the service put both jobs on one spine"; exit 1; }
split $s0 $s1 25 || { echo "FAIL: with the service, one spine carried almost everything"; exit 1; }
wait_for "$tmp/fabricd.log" "release" "the jobs' releases"

# 3. A job killed mid-run: its lease runs out, and the next job takes its spine.
job_start killed 29504 h0 h2 "${ring[@]}" -n 100000
wait_for "$tmp/killed/out.0" "by the fabric service" "the doomed job planned"
first=$(spine_of killed)
# The operator's view, from h3: the one job, its lane through that spine, the links it loads.
"$tools/netlab" run "$NETLAB_NAME" h3 -- "$c4plan" --service "$svc" --key-file "$tmp/key" > "$tmp/view.txt" 2>&1 ||
  { cat "$tmp/view.txt"; echo "FAIL: c4-plan --service"; exit 1; }
cat "$tmp/view.txt"
grep -q "1 job(s)" "$tmp/view.txt" && grep -q "leaf0 -> $first" "$tmp/view.txt" ||
  { echo "FAIL: c4-plan --service does not show the running job on $first"; exit 1; }
"$tools/netlab" run "$NETLAB_NAME" h3 -- "$c4plan" --service "$svc" --key-file "$tmp/key" --json |
  "$py" -c 'import json, sys; v = json.load(sys.stdin); assert len(v["jobs"]) == 1 and v["links"], v' ||
  { echo "FAIL: c4-plan --service --json"; exit 1; }
# (netlab run execs the command: each pid is the rank's own process.)
for pid in $(cat "$tmp/killed/pids"); do kill -9 "$pid" 2> /dev/null || true; done
for pid in $(cat "$tmp/killed/pids"); do wait "$pid" 2> /dev/null || true; done
wait_for "$tmp/fabricd.log" "expire" "the killed job's lease running out"
job_start after-kill 29505 h1 h3 "${ring[@]}" -n 4
job_wait after-kill
echo "killed job on $first; the job after it on $(spine_of after-kill)"
[ "$(spine_of after-kill)" = "$first" ] || { echo "FAIL: the killed job's spine was not freed"; exit 1; }

# 4. An uplink throttled under two jobs: both move off it. Each job runs until the test has seen
# what it checks (iterations timed and checked one by one), then is stopped.
timeline=("$perf" -C allreduce -b 16M -e 16M -c 1 -w 1 -n 100000 --timeline 1)
job_start slow-a 29508 h0 h2 C4_LANES=2 C4_REBALANCE_MS=200 "${timeline[@]}"
job_start slow-b 29509 h1 h3 C4_LANES=2 "${timeline[@]}"
wait_iters slow-a 2
wait_iters slow-b 2
view() { "$tools/netlab" run "$NETLAB_NAME" h3 -- "$c4plan" --service "$svc" --key-file "$tmp/key" --json; }
# The spines each job's lanes cross, from the service's view: both jobs on both spines.
view | "$py" -c '
import json, sys
v = json.load(sys.stdin)
for j in v["jobs"]:
    print(j["name"], sorted(set(l["path"].split(" -> ")[2] for l in j["lanes"])))
    assert len(j["lanes"]) == 2 and len(set(l["path"].split(" -> ")[2] for l in j["lanes"])) == 2, j' ||
  { echo "FAIL: the service did not spread each job's two lanes over both spines"; exit 1; }
"$tools/netlab" link "$NETLAB_NAME" leaf0-spine1 --rate 250mbit
echo "throttled leaf0-spine1 to 25% after $(iters slow-a) and $(iters slow-b) iterations"
wait_for "$tmp/fabricd.log" "link .*spine1.* booked slow" "the service booking the throttled uplink"
wait_for "$tmp/slow-b/out.0" "moved by the fabric service" "job B moving its lane off spine 1"
wait_for "$tmp/slow-a/out.0" "moved by the fabric service" "job A moving its lane off spine 1"
grep -h "booked slow\|move [0-9]* lane" "$tmp/fabricd.log" | cut -c1-240
grep -h "moved by the fabric service" "$tmp/slow-a/out.0" "$tmp/slow-b/out.0" | cut -c1-240
# The service's books: no lane through spine 1, the link believed slow.
for ((i = 0; ; i++)); do
  view > "$tmp/view.json" 2>&1 && "$py" -c '
import json, sys
v = json.load(open(sys.argv[1]))
assert not [l for j in v["jobs"] for l in j["lanes"] if "spine1" in l["path"]]
assert [h for h in v["health"] if "spine1" in h["link"] and h["state"] == "slow"]' "$tmp/view.json" && break
  [ $i -lt 1200 ] || { cat "$tmp/view.json"; echo "FAIL: the service's books keep a lane through spine 1"; exit 1; }
  sleep 0.1
done
"$tools/netlab" run "$NETLAB_NAME" h3 -- "$c4plan" --service "$svc" --key-file "$tmp/key" > "$tmp/view.txt" 2>&1 ||
  { cat "$tmp/view.txt"; echo "FAIL: c4-plan --service"; exit 1; }
grep -A3 "link health" "$tmp/view.txt"
grep -A3 "link health" "$tmp/view.txt" | grep -q "spine1.* slow, planned at" ||
  { cat "$tmp/view.txt"; echo "FAIL: c4-plan --service does not show the slow link"; exit 1; }
# The traffic: once the moves are made, spine 1 carries next to nothing. The old lanes may still
# drain what they had queued at 25% speed; a window of 3 iterations of each job in which spine 1
# carries at most 5% of the spines' bytes must come within 20 windows.
for ((w = 1; ; w++)); do
  na=$(iters slow-a) nb=$(iters slow-b)
  before=($(spine_bytes))
  wait_iters slow-a $((na + 3))
  wait_iters slow-b $((nb + 3))
  after=($(spine_bytes))
  s0=$((after[0] - before[0])) s1=$((after[1] - before[1]))
  echo "after the moves, window $w (3 iterations of each job): spine bytes $s0 / $s1"
  [ $((s1 * 100)) -le $(((s0 + s1) * 5)) ] && break
  [ $w -lt 20 ] || { echo "FAIL: spine 1 still carries the jobs' traffic"; exit 1; }
done
stop_job slow-a
stop_job slow-b
"$tools/netlab" link "$NETLAB_NAME" leaf0-spine1 --rate 1gbit > /dev/null

# 5. The service killed mid-run: the running job ends right; the next one plans alone.
job_start orphan 29506 h0 h2 "${ring[@]}" -n 40
wait_for "$tmp/orphan/out.0" "by the fabric service" "the job planned before the service dies"
kill -9 "$daemon"
wait "$daemon" 2> /dev/null || true
daemon=""
job_wait orphan
job_start alone-again 29507 h1 h3 "${ring[@]}" -n 4
job_wait alone-again
grep -q "does not plan this job, which plans alone" "$tmp/alone-again/out.0" ||
  { cat "$tmp/alone-again/out.0"; echo "FAIL: no warning that the job plans alone"; exit 1; }
grep -m1 "plans alone" "$tmp/alone-again/out.0"
echo "PASS"
