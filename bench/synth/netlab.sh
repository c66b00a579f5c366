#!/usr/bin/env bash
# A synthesized schedule against the generated algorithms on a fabric with mixed link rates, in one
# run (docs/performance.md): 4 hosts on 2 leaves and 2 spines, host links 4x the
# leaf-spine links (--host-rate / --uplink-rate), one rank per host over tcp. c4-synth writes the
# AllGather and AllReduce schedules for the fabric's topology file; then c4-perf runs each
# collective with the file and with every generated algorithm (C4_ALGO), the modes interleaved
# ROUNDS times, and the median algbw of each mode at each size is printed with the file's ratio to
# the best generated one. Then c4-sim predicts every mode on the fabric's topology file and the
# predicted time is printed against the measured one (time = size / algbw).
#   bench/synth/netlab.sh [BUILD_DIR] [ROUNDS] [SIZES...]   (defaults: build 3 4M 16M)
#   CHUNKS=K (c4-synth --chunks, default 1), COLLS="allgather allreduce" (the default; alltoall too)
#   choose what runs.
#   SIM_ARGS="--link-efficiency ..." adds c4-sim options (bench/sim/calibrate.sh prints the calibrated ones).
# Needs root (network namespaces); about 2 minutes per round.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${NETLAB_NAME:-}" ]; then
  build=$(cd "${1:-$root/build}" && pwd)
  shift || true
  exec "$root/tools/netlab/netlab" session --hosts 4 --ports 1 --leaves 2 --spines 2 --host-rate 400mbit \
    --uplink-rate 100mbit -- "$0" "$build" "$@"
fi
. "$root/tests/netlab/netlab_lib.sh"
build=$1 rounds=${2:-3}
shift 2 || shift $#
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(4M 16M)
perf=$build/bin/c4-perf
synth=$root/tools/c4-synth/c4-synth
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
colls=(${COLLS:-allgather allreduce})
for coll in "${colls[@]}"; do
  echo "[bench] c4-synth --coll $coll --chunks ${CHUNKS:-1} on $NETLAB_TOPO" >&2
  "$synth" --topo "$NETLAB_TOPO" --coll $coll --chunks "${CHUNKS:-1}" --time-limit 120 --out "$tmp/$coll.json" >&2
done
export C4_TIMEOUT=300 C4_TOPO_FILE="$NETLAB_TOPO"
declare -A res
for coll in "${colls[@]}"; do
  modes=(file ring rhd direct)
  [ $coll = allreduce ] && modes=(file ring rhd tree direct)
  [ $coll = alltoall ] && modes=(file direct)  # the only generated alltoall
  for ((round = 1; round <= rounds; round++)); do
    for mode in "${modes[@]}"; do
      for size in "${sizes[@]}"; do
        out="$tmp/$coll-$mode-$size-$round"
        mkdir -p "$out"
        if [ $mode = file ]; then env=(C4_SCHEDULE_FILE="$tmp/$coll.json"); else env=(C4_ALGO=$mode); fi
        echo "[bench] round $round/$rounds: $coll $size $mode" >&2
        netlab_run_ranks 4 1 "$out" "${env[@]}" "$perf" -C $coll -b $size -e $size -c 1 -n 5 -w 1 >&2 ||
          { echo "FAIL: $coll $mode $size" >&2; exit 1; }
        grep -q "Out of bounds values : 0 OK" "$out/out.0" || { echo "FAIL: wrong results" >&2; exit 1; }
        # algbw in MB/s from the out-of-place time (c4-perf prints GB/s with two decimals).
        res[$coll,$mode,$size]+="$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {printf "%.2f", $1 / $6; exit}' "$out/out.0") "
      done
    done
  done
  echo "## $coll: algbw MB/s (median of $rounds), out of place"
  printf "| size |"; for m in "${modes[@]}"; do printf " %s |" "$m"; done; echo " file / best generated |"
  printf "|---|"; for m in "${modes[@]}"; do printf -- "---|"; done; echo "---|"
  for size in "${sizes[@]}"; do
    line="| $size |"
    best=0 file=0
    for m in "${modes[@]}"; do
      med=$(echo ${res[$coll,$m,$size]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
      line+=" $med |"
      if [ $m = file ]; then file=$med; elif awk -v a="$med" -v b="$best" 'BEGIN {exit !(a > b)}'; then best=$med; fi
    done
    echo "$line $(awk -v a="$file" -v b="$best" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}') |"
  done
  echo
  echo "## $coll: c4-sim predicted against measured (ms; SIM_ARGS: ${SIM_ARGS:-none})"
  echo "| mode | size | predicted | measured | predicted / measured |"
  echo "|---|---|---|---|---|"
  for m in "${modes[@]}"; do
    for size in "${sizes[@]}"; do
      if [ $m = file ]; then what=(--schedule "$tmp/$coll.json"); else what=(--coll $coll --algo $m); fi
      # shellcheck disable=SC2086
      "$build/bin/c4-sim" --topo "$NETLAB_TOPO" "${what[@]}" --bytes $size --quiet ${SIM_ARGS:-} \
        --json "$tmp/sim.json" > /dev/null || { echo "FAIL: c4-sim $coll $m $size" >&2; exit 1; }
      pred=$(python3 -c 'import json, sys; print("%.1f" % (json.load(open(sys.argv[1]))["results"][0]["seconds"] * 1e3))' \
        "$tmp/sim.json")
      med=$(echo ${res[$coll,$m,$size]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
      meas=$(awk -v s="$size" -v bw="$med" 'BEGIN {u = substr(s, length(s)); v = s + 0;
        m = (u == "K" ? 1024 : u == "M" ? 1048576 : u == "G" ? 1073741824 : 1); printf "%.1f", v * m / bw / 1e3}')
      echo "| $m | $size | $pred | $meas | $(awk -v a="$pred" -v b="$meas" 'BEGIN {printf "%.2f", a / b}') |"
    done
  done
done
