#!/usr/bin/env bash
# Concurrent jobs with and without C4P's fabric service (c4-fabricd, docs/c4p.md "The fabric
# service"), across emulated hosts (tools/netlab): JOBS jobs (2 or 3) on 2 x JOBS hosts x 1 port, 2
# leaves, JOBS spines, every link RATE. Job i runs on h<i> (leaf 0) and h<i+JOBS> (leaf 1): with
# JOBS=2, A on h0/h2 and B on h1/h3; each a 2-rank ring AllReduce of SIZE over one lane
# (C4_LANES=1), each crossing the spines once each way. Each job alone, then all at once planned
# alone (c4p: all take the same spine), then all at once with the service; REPS rounds of each.
# Prints every run's busbw and, per job, the concurrent busbw over its solo busbw (the median of
# the rounds). Needs root.
#   [JOBS=2|3] bench/netlab/fabric_bench.sh [RATE] [SIZE]     (defaults: 200mbit, 16M; REPS=3 ITERS=10)
# Writes ${OUT:-bench-results}/netlab_fabric.txt (JOBS=3: netlab_fabric3.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-200mbit}
SIZE=${2:-16M}
REPS=${REPS:-3}
ITERS=${ITERS:-10}
JOBS=${JOBS:-2}
[ "$JOBS" = 2 ] || [ "$JOBS" = 3 ] || { echo "JOBS=$JOBS: 2 or 3" >&2; exit 2; }
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
bin=$(cd "${C4_BIN_DIR:-build/bin}" && pwd)
netlab=tools/netlab/netlab
py=/usr/bin/python3

if [ -z "${NETLAB_NAME:-}" ]; then
  "$py" $netlab session --hosts $((2 * JOBS)) --ports 1 --leaves 2 --spines "$JOBS" --rate "$RATE" -- "$0" "$RATE" \
    "$SIZE" | tee "$OUT/netlab_fabric$([ "$JOBS" = 3 ] && echo 3).txt"
  exit "${PIPESTATUS[0]}"
fi

. tests/netlab/netlab_lib.sh  # addr, job_start, spine_of, fabric_cleanup
tmp=$(mktemp -d)
daemon=""
trap fabric_cleanup EXIT
export C4_PLANNER=c4p C4_TOPO_FILE=$NETLAB_TOPO C4_LANES=1 C4_ALGO=ring C4_REBALANCE_MS=0 C4_DEBUG=INFO \
  C4_DEBUG_SUBSYS=PLAN
start() {  # NAME PORT HOST0 HOST1 [ENV...]: a 2-rank job in the background
  local name=$1 port=$2 h0=$3 h1=$4
  shift 4
  job_start "$name" "$port" "$h0" "$h1" "$@" "$bin/c4-perf" -C allreduce -b "$SIZE" -e "$SIZE" -c 1 -n "$ITERS" -w 2
}
busbw() {  # NAME: its out-of-place busbw (GB/s, from the size and time), or exits on a failed run
  "$py" - "$tmp/$1/out.0" "$1" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
row = [l for l in text.splitlines() if re.match(r"^ +\d+ +\d+ +float", l)]
if not row or "Out of bounds values : 0 OK" not in text:
    print("%s FAILED" % sys.argv[2], file=sys.stderr); print(text[-2000:], file=sys.stderr); sys.exit(1)
f = row[0].split()
print("%.4f" % (float(f[0]) / (float(f[5]) * 1e3)))  # out-of-place; a 2-rank ring's busbw factor is 1
PYEOF
}
names=(a b c)
names=("${names[@]:0:$JOBS}")
# start_job KIND I PORT [ENV...]: job I (0-based) of KIND (solo, alone, svc) on its two hosts.
start_job() { local kind=$1 i=$2 port=$3; shift 3; start "$kind-${names[$i]}" "$port" "h$i" "h$((i + JOBS))" "$@"; }

head -c 32 /dev/urandom | base64 > "$tmp/key"
chmod 600 "$tmp/key"
svc="$(addr h0):7471"
echo "== $((2 * JOBS)) hosts x 1 port, 2 leaves, $JOBS spines, links $RATE; $JOBS 2-rank jobs (job i on h<i> and" \
  "h<i+$JOBS>), ring AllReduce $SIZE, 1 lane"
for rep in $(seq 1 "$REPS"); do
  p=$((29500 + rep * 10))
  for ((i = 0; i < JOBS; i++)); do start_job solo $i $((p + i)); wait; done
  for ((i = 0; i < JOBS; i++)); do start_job alone $i $((p + 3 + i)); done
  wait
  $netlab run "$NETLAB_NAME" h0 -- "$bin/c4-fabricd" --topo "$NETLAB_TOPO" --key-file "$tmp/key" --listen "$svc" \
    --db "$tmp/fabric$rep.db" > "$tmp/fabricd$rep.log" 2>&1 &
  daemon=$!
  for _ in $(seq 1 300); do grep -q listening "$tmp/fabricd$rep.log" && break; sleep 0.1; done
  for ((i = 0; i < JOBS; i++)); do
    start_job svc $i $((p + 6 + i)) C4_PLANNER_SERVICE=$svc C4_PLANNER_KEY_FILE=$tmp/key
  done
  for pid in $(jobs -p); do [ "$pid" = "$daemon" ] || wait "$pid"; done
  kill "$daemon"; wait "$daemon" 2> /dev/null || true; daemon=""
  for n in "${names[@]}"; do
    grep -h -o "booked the job as [0-9a-f]* in [0-9.]* ms" "$tmp/svc-$n/out.0" | sed "s/^/round $rep # /" >&2
  done
  for kind in solo alone svc; do
    for n in "${names[@]}"; do
      printf "round %d %-8s busbw %s GB/s  on %s\n" "$rep" "$kind-$n" "$(busbw "$kind-$n")" "$(spine_of "$kind-$n")"
    done
  done
done | tee "$tmp/runs.txt"
"$py" - "$tmp/runs.txt" <<'PYEOF'
import collections, statistics, sys
bw = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    bw[f[2]].append(float(f[4]))
med = {k: statistics.median(v) for k, v in bw.items()}
for job in sorted(k.split("-")[1] for k in med if k.startswith("solo-")):
    solo = med["solo-" + job]
    print("job %s: solo %.4f GB/s; concurrent, planned alone %.2fx solo; with the service %.2fx solo"
          % (job.upper(), solo, med["alone-" + job] / solo, med["svc-" + job] / solo))
PYEOF
