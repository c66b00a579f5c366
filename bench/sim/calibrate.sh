#!/usr/bin/env bash
# c4-sim's link efficiency, measured on netlab (docs/c4-sim.md, "Calibration"): what fraction of a
# tbf-shaped link's nominal rate c4comm's tcp transport gets, with 1, 2 and 4 lanes (tcp streams)
# sharing the link. Two ranks run a 2-rank AllGather (each sends SIZE/2 to the other, both directions
# at once) once across a leaf-spine uplink of UPLINK rate (h0 on leaf0, h2 on leaf1, one spine) and
# once between two hosts on one leaf (host links of HOST rate); efficiency = (SIZE/2 at the nominal
# rate) / measured time, the median of ROUNDS rounds.
#   bench/sim/calibrate.sh [BUILD_DIR] [ROUNDS] [SIZE]     (defaults: build 5 16M)
#   HOST_RATE=400mbit UPLINK_RATE=100mbit (the rates of bench/synth/netlab.sh's fabric)
# Needs root (network namespaces); about 40 s per round.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
host_rate=${HOST_RATE:-400mbit} up_rate=${UPLINK_RATE:-100mbit}
if [ -z "${NETLAB_NAME:-}" ]; then
  build=$(cd "${1:-$root/build}" && pwd)
  shift || true
  exec "$root/tools/netlab/netlab" session --hosts 3 --ports 1 --leaves 2 --spines 1 --host-rate "$host_rate" \
    --uplink-rate "$up_rate" -- "$0" "$build" "$@"
fi
build=$1 rounds=${2:-5} size=${3:-16M}
perf=$build/bin/c4-perf
netlab=$root/tools/netlab/netlab
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bits() { awk -v s="$1" 'BEGIN {u = substr(s, length(s)); v = s + 0;
  m = (u == "k" ? 1e3 : u == "m" ? 1e6 : u == "g" ? 1e9 : 1); print v * m}' <<< ""; }
bytes() { awk -v s="$1" 'BEGIN {u = substr(s, length(s)); v = s + 0;
  m = (u == "K" ? 1024 : u == "M" ? 1048576 : u == "G" ? 1073741824 : 1); printf "%d", v * m}'; }
up_bps=$(bits "${up_rate%bit}") host_bps=$(bits "${host_rate%bit}")
nbytes=$(bytes "$size")
master() { "$netlab" addr "$NETLAB_NAME" "$1"; }
# run_pair HOST_A HOST_B LANES OUT: a 2-rank AllGather between two hosts; prints the time in us.
run_pair() {
  local a=$1 b=$2 lanes=$3 out=$4 m pids=() r=0 h
  m=$(master "$a")
  mkdir -p "$out"
  for h in "$a" "$b"; do
    "$netlab" run "$NETLAB_NAME" "$h" -- env RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR="$m" MASTER_PORT=29500 \
      C4_SOCKET_IFNAME=p0 C4_TOPO_FILE="$NETLAB_TOPO" C4_TIMEOUT=300 C4_LANES=$lanes \
      "$perf" -C allgather -b "$size" -e "$size" -c 1 -n 3 -w 1 > "$out/out.$r" 2>&1 &
    pids+=($!)
    r=$((r + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "FAIL: $a-$b lanes $lanes" >&2; cat "$out"/out.* >&2; exit 1; }; done
  grep -q "Out of bounds values : 0 OK" "$out/out.0" || { echo "FAIL: wrong results" >&2; exit 1; }
  awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {print $6; exit}' "$out/out.0"
}
declare -A res
med() { echo ${res[$1,$2]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for ((round = 1; round <= rounds; round++)); do
  for lanes in 1 2 4; do
    for pair in "h0 h2 uplink $up_bps" "h0 h1 host $host_bps"; do
      set -- $pair
      echo "[calibrate] round $round/$rounds: $3 link ($1-$2), $lanes lane(s)" >&2
      us=$(run_pair "$1" "$2" $lanes "$tmp/$3-$lanes-$round")
      res[$3,$lanes]+="$(awk -v b="$nbytes" -v bps="$4" -v us="$us" 'BEGIN {printf "%.3f", (b / 2 * 8 / bps) / (us / 1e6)}') "
    done
  done
done
echo "## tcp over tbf: efficiency = nominal time / measured ($size 2-rank AllGather, median of $rounds; all rounds)"
echo "| link | rate | 1 lane | 2 lanes | 4 lanes |"
echo "|---|---|---|---|---|"
for kind in uplink host; do
  line="| $kind | $([ $kind = uplink ] && echo "$up_rate" || echo "$host_rate") |"
  for lanes in 1 2 4; do
    line+=" $(med $kind $lanes) (${res[$kind,$lanes]% }) |"
  done
  echo "$line"
done
echo
echo "SIM_ARGS=\"--link-efficiency $up_rate:$(med uplink 1),$(med uplink 2),$(med uplink 4)" \
  "--link-efficiency $host_rate:$(med host 1),$(med host 2),$(med host 4)\""
