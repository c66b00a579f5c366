#!/usr/bin/env bash
# C4P under a fault mid-run on netlab (4 hosts x 2 ports, 2 leaves, 2 spines, links RATE, one rank
# per host on both ports, ring AllReduce SIZE, c4-perf --timeline: every iteration timed on its own).
# After WARM iterations the uplink leaf0-spine1 is throttled to 25% (then the ring's cross-leaf
# traffic has 1.25 of 2 links: 0.625 x ideal remains) or cut (1 of 2: 0.5 x ideal); with 3 spines
# (spare), an uplink a lane uses is throttled and the third spine is spare (1.0 x ideal). Prints each
# iteration's busbw and the mean from the 5th iteration after the fault on, against what the
# remaining capacity allows. Needs root.
#   bench/netlab/c4p_fault_bench.sh [RATE] [SIZE]      (defaults 1gbit 64M; ITERS=24 WARM=6)
# Writes ${OUT:-bench-results}/netlab_c4p_fault.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-1gbit}
SIZE=${2:-64M}
ITERS=${ITERS:-24}
WARM=${WARM:-6}
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
bin=$(cd "${C4_BIN_DIR:-build/bin}" && pwd)
netlab=tools/netlab/netlab
py=/usr/bin/python3

if [ -z "${NETLAB_NAME:-}" ]; then
  for fault in throttle cut spare; do
    FAULT=$fault "$py" $netlab session --hosts 4 --ports 2 --leaves 2 --spines "$([ $fault = spare ] && echo 3 || echo 2)" \
      --rate "$RATE" -- "$0" "$RATE" "$SIZE"
  done | tee "$OUT/netlab_c4p_fault.txt"
  exit "${PIPESTATUS[0]}"
fi

master=$($netlab addr "$NETLAB_NAME" h0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for h in 0 1 2 3; do
  $netlab run "$NETLAB_NAME" "h$h" -- env RANK=$h LOCAL_RANK=0 WORLD_SIZE=4 MASTER_ADDR="$master" MASTER_PORT=29500 \
    C4_SOCKET_IFNAME=p0 C4_TCP_PORTS=p0,p1 C4_LANES=2 C4_ALGO=ring C4_PLANNER=c4p C4_TIMEOUT=60 C4_DEBUG=INFO \
    C4_DEBUG_SUBSYS=PLAN \
    "$bin/c4-perf" -C allreduce -b "$SIZE" -e "$SIZE" -c 0 -n "$ITERS" -w 1 --timeline 1 > "$tmp/out.$h" 2>&1 &
done
for _ in $(seq 1 600); do
  n=$(grep -c 'iteration' "$tmp/out.0" 2>/dev/null) || n=0
  [ "$n" -ge "$WARM" ] && break
  sleep 0.1
done
at=$(grep -c 'iteration' "$tmp/out.0") || at=0
if [ "$FAULT" = throttle ]; then
  $netlab link "$NETLAB_NAME" leaf0-spine1 --rate 250mbit >/dev/null
elif [ "$FAULT" = spare ]; then  # the uplink a lane of rank 1's connection to rank 2 crosses
  spine=$(grep -m1 -o "rank 1 <-> rank 2 lane 0: .* via spine[0-9]" "$tmp/out.0" | grep -o "spine[0-9]$")
  $netlab link "$NETLAB_NAME" "leaf0-$spine" --rate 250mbit >/dev/null
else
  $netlab link "$NETLAB_NAME" leaf0-spine1 --down >/dev/null
fi
wait
"$py" - "$FAULT" "$RATE" "$at" "$tmp/out.0" <<'PYEOF'
import re, sys
fault, rate, at, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
m = re.match(r"([0-9.]+)([kmg]?)bit", rate.lower())
ideal = 2 * float(m.group(1)) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1}[m.group(2)] / 8
left = ideal * {"throttle": 0.625, "cut": 0.5, "spare": 1.0}[fault]
bus = [float(x) for x in re.findall(r"iteration +\d+: +[0-9.]+ us +algbw +[0-9.]+ +busbw +([0-9.]+)", open(path).read())]
# The fault landed during iteration `at` (the first not printed yet when it was applied).
before = bus[:at]
after = bus[at + 5:]
what = {"throttle": "leaf0-spine1 throttled to 25%", "cut": "leaf0-spine1 cut",
        "spare": "a used uplink throttled to 25%, a third spine spare"}[fault]
print("== %s after %d iterations; ideal busbw %.3f GB/s, the remaining capacity allows %.3f" % (what, at, ideal, left))
print("busbw per iteration: " + " ".join("%.3f" % b for b in bus))
print("before: mean %.3f (%.2f x ideal); iteration of the fault and the 4 after: %s; from the 5th after: mean %.3f = "
      "%.2f x what remains (worst %.2f)" % (sum(before) / len(before), sum(before) / len(before) / ideal,
      " ".join("%.3f" % b for b in bus[at:at + 5]), sum(after) / len(after), sum(after) / len(after) / left,
      min(after) / left))
PYEOF
