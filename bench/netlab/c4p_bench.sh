#!/usr/bin/env bash
# C4P against ECMP hashing across emulated hosts (tools/netlab): 4 hosts x 2 NIC ports, 2 leaves,
# 2 spines, every link RATE (a ring's cross-leaf traffic fits the uplinks: no oversubscription),
# one rank per host using both ports (2 lanes per connection), ring AllReduce of SIZE.
# c4p runs REPS times; ecmp (seeded random source ports, what hashing gives) once per seed 1..SEEDS.
# Prints busbw per run, as a fraction of the ideal (2 ports x RATE per rank), and the planner's own
# prediction (bottleneck link time over the ideal), then c4p's worst over ecmp's worst. Needs root.
#   bench/netlab/c4p_bench.sh [RATE] [SIZE]        (defaults: 1gbit, 64M; SEEDS=10 REPS=3 ITERS=3)
# Writes ${OUT:-bench-results}/netlab_c4p.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-1gbit}
SIZE=${2:-64M}
SEEDS=${SEEDS:-10}
REPS=${REPS:-3}
ITERS=${ITERS:-3}
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
bin=$(cd "${C4_BIN_DIR:-build/bin}" && pwd)
netlab=tools/netlab/netlab
py=/usr/bin/python3

if [ -z "${NETLAB_NAME:-}" ]; then
  "$py" $netlab session --hosts 4 --ports 2 --leaves 2 --spines 2 --rate "$RATE" -- "$0" "$RATE" "$SIZE" |
    tee "$OUT/netlab_c4p.txt"
  exit "${PIPESTATUS[0]}"
fi

master=$($netlab addr "$NETLAB_NAME" h0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ideal=$("$py" -c "
import re,sys
m=re.match(r'([0-9.]+)([kmg]?)bit', sys.argv[1].lower())
print(2*float(m.group(1))*{'':1e-9,'k':1e-6,'m':1e-3,'g':1}[m.group(2)]/8)" "$RATE")
run() {  # label env...: 4 ranks, one per host; prints "label busbw fraction predicted"
  local label=$1; shift
  for h in 0 1 2 3; do
    $netlab run "$NETLAB_NAME" "h$h" -- env RANK=$h LOCAL_RANK=0 WORLD_SIZE=4 MASTER_ADDR="$master" MASTER_PORT=29500 \
      C4_SOCKET_IFNAME=p0 C4_TCP_PORTS=p0,p1 C4_LANES=2 C4_ALGO=ring C4_DEBUG=INFO C4_DEBUG_SUBSYS=PLAN "$@" \
      "$bin/c4-perf" -C allreduce -b "$SIZE" -e "$SIZE" -d float -o sum -c 1 -n "$ITERS" -w 1 > "$tmp/out.$h" 2>&1 &
  done
  wait
  "$py" - "$label" "$ideal" "$tmp/out.0" <<'PYEOF'
import re, sys
label, ideal, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
text = open(path).read()
row = [l for l in text.splitlines() if re.match(r"^ +\d+ +\d+ +float", l)]
if not row or "Out of bounds values : 0 OK" not in text:
    print("%-10s FAILED" % label); print(text[-2000:]); sys.exit(1)
f = row[0].split()
busbw = float(f[0]) / (float(f[5]) * 1e3) * 1.5   # ring AllReduce busbw factor 2(n-1)/n on 4 ranks
m = re.search(r"ideal ([0-9.]+) ms, plan ([0-9.]+) ms", text)
pred = float(m.group(1)) / float(m.group(2)) if m else float("nan")
print("%-10s busbw %.4f GB/s  %.2f x ideal  (plan predicts %.2f)" % (label, busbw, busbw / ideal, pred))
PYEOF
}
echo "== 4 hosts x 2 ports, 2 leaves, 2 spines, links $RATE; ring AllReduce $SIZE float sum; ideal busbw $ideal GB/s"
for r in $(seq 1 "$REPS"); do run "c4p#$r" C4_PLANNER=c4p; done | tee "$tmp/c4p.txt"
for s in $(seq 1 "$SEEDS"); do run "ecmp/s$s" C4_PLANNER=ecmp C4_PLAN_SEED=$s; done | tee "$tmp/ecmp.txt"
"$py" - "$tmp/c4p.txt" "$tmp/ecmp.txt" <<'PYEOF'
import sys
def frac(p): return [float(l.split()[4]) for l in open(p) if "x ideal" in l]
c, e = frac(sys.argv[1]), frac(sys.argv[2])
print("c4p: mean %.2f worst %.2f x ideal (%d runs); ecmp: mean %.2f worst %.2f x ideal (%d seeds); "
      "c4p worst / ecmp worst = %.2f" % (sum(c)/len(c), min(c), len(c), sum(e)/len(e), min(e), len(e), min(c)/min(e)))
PYEOF
