#!/usr/bin/env bash
# Concurrent jobs with and without C4P's fabric service (c4-fabricd, docs/c4p.md "The fabric
# service"), across emulated hosts (tools/netlab): 4 hosts x 1 port, 2 leaves, 2 spines, every link
# RATE. Job A runs on h0/h2, job B on h1/h3, each a 2-rank ring AllReduce of SIZE over one lane
# (C4_LANES=1), each crossing the spines once each way. Each job alone, then both at once planned
# alone (c4p: both take the same spine), then both at once with the service; REPS rounds of each.
# Prints every run's busbw and, per job, the concurrent busbw over its solo busbw (the median of
# the rounds). Needs root.
#   bench/netlab/fabric_bench.sh [RATE] [SIZE]     (defaults: 200mbit, 16M; REPS=3 ITERS=10)
# Writes ${OUT:-bench-results}/netlab_fabric.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-200mbit}
SIZE=${2:-16M}
REPS=${REPS:-3}
ITERS=${ITERS:-10}
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
bin=$(cd "${C4_BIN_DIR:-build/bin}" && pwd)
netlab=tools/netlab/netlab
py=/usr/bin/python3

if [ -z "${NETLAB_NAME:-}" ]; then
  "$py" $netlab session --hosts 4 --ports 1 --leaves 2 --spines 2 --rate "$RATE" -- "$0" "$RATE" "$SIZE" |
    tee "$OUT/netlab_fabric.txt"
  exit "${PIPESTATUS[0]}"
fi

tmp=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
addr() { $netlab addr "$NETLAB_NAME" "$1"; }
export C4_PLANNER=c4p C4_TOPO_FILE=$NETLAB_TOPO C4_LANES=1 C4_ALGO=ring C4_REBALANCE_MS=0 C4_DEBUG=INFO \
  C4_DEBUG_SUBSYS=PLAN
start() {  # NAME PORT HOST0 HOST1 [ENV...]: a 2-rank job in the background
  local name=$1 port=$2 h0=$3 h1=$4 r h
  shift 4
  mkdir -p "$tmp/$name"
  for r in 0 1; do
    h=$h0
    [ $r = 1 ] && h=$h1
    $netlab run "$NETLAB_NAME" "$h" -- env RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR="$(addr "$h0")" \
      MASTER_PORT=$port C4_SOCKET_IFNAME=p0 "$@" "$bin/c4-perf" -C allreduce -b "$SIZE" -e "$SIZE" -c 1 \
      -n "$ITERS" -w 2 > "$tmp/$name/out.$r" 2>&1 &
  done
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
spine() { grep -A2 "C4P plan (lane" "$tmp/$1/out.0" | grep -m1 -o "spine[01]" || echo "?"; }

head -c 32 /dev/urandom | base64 > "$tmp/key"
chmod 600 "$tmp/key"
svc="$(addr h0):7471"
echo "== 4 hosts x 1 port, 2 leaves, 2 spines, links $RATE; two 2-rank jobs (A: h0,h2; B: h1,h3), ring AllReduce $SIZE, 1 lane"
for rep in $(seq 1 "$REPS"); do
  p=$((29500 + rep * 10))
  start solo-a $p h0 h2; wait
  start solo-b $((p + 1)) h1 h3; wait
  start alone-a $((p + 2)) h0 h2; start alone-b $((p + 3)) h1 h3; wait
  $netlab run "$NETLAB_NAME" h0 -- "$bin/c4-fabricd" --topo "$NETLAB_TOPO" --key-file "$tmp/key" --listen "$svc" \
    --db "$tmp/fabric$rep.db" > "$tmp/fabricd$rep.log" 2>&1 &
  daemon=$!
  for _ in $(seq 1 300); do grep -q listening "$tmp/fabricd$rep.log" && break; sleep 0.1; done
  start svc-a $((p + 4)) h0 h2 C4_PLANNER_SERVICE=$svc C4_PLANNER_KEY_FILE=$tmp/key
  start svc-b $((p + 5)) h1 h3 C4_PLANNER_SERVICE=$svc C4_PLANNER_KEY_FILE=$tmp/key
  for pid in $(jobs -p); do [ "$pid" = "$daemon" ] || wait "$pid"; done
  kill "$daemon"; wait "$daemon" 2> /dev/null || true; daemon=""
  grep -h -o "booked the job as [0-9a-f]* in [0-9.]* ms" "$tmp/svc-a/out.0" "$tmp/svc-b/out.0" | sed "s/^/round $rep # /" >&2
  for j in solo-a solo-b alone-a alone-b svc-a svc-b; do
    printf "round %d %-8s busbw %s GB/s  on %s\n" "$rep" "$j" "$(busbw $j)" "$(spine $j)"
  done
done | tee "$tmp/runs.txt"
"$py" - "$tmp/runs.txt" <<'PYEOF'
import collections, statistics, sys
bw = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    bw[f[2]].append(float(f[4]))
med = {k: statistics.median(v) for k, v in bw.items()}
for job in "ab":
    solo = med["solo-" + job]
    print("job %s: solo %.4f GB/s; concurrent, planned alone %.2fx solo; with the service %.2fx solo"
          % (job.upper(), solo, med["alone-" + job] / solo, med["svc-" + job] / solo))
PYEOF
