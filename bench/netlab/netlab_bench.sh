#!/usr/bin/env bash
# AllReduce across emulated hosts (tools/netlab): c4 beside Gloo's TCP transport and Open MPI's tcp
# BTL on the same fabric, busbw as a fraction of the link rate. Needs root (network namespaces).
#   bench/netlab/netlab_bench.sh [RATE] [SIZE]        (defaults: 1gbit, 64M)
# Configurations:
#   1port: 2 hosts x 1 NIC port, 1 rank each (every link RATE);
#   2port: 2 hosts x 2 NIC ports on two rails (port i of each host on leaf i), 1 rank each: c4 uses
#          one lane per port (C4_TCP_PORTS=p0,p1); Gloo and MPI use one connection per peer.
# Writes ${OUT:-bench-results}/netlab_allreduce.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-1gbit}
SIZE=${2:-64M}
ITERS=${ITERS:-5}
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
bin=${C4_BIN_DIR:-build/bin}
netlab=tools/netlab/netlab
py=/usr/bin/python3

if [ -z "${NETLAB_NAME:-}" ]; then
  for cfg in 1port 2port; do
    if [ $cfg = 1port ]; then
      opts=(--hosts 2 --ports 1 --leaves 2 --spines 2 --rate "$RATE")
    else
      opts=(--hosts 2 --ports 2 --leaves 2 --spines 2 --placement rail --rate "$RATE")
    fi
    CFG=$cfg "$py" $netlab session "${opts[@]}" -- "$0" "$RATE" "$SIZE"
  done | tee "$OUT/netlab_allreduce.txt"
  exit 0
fi

# Inside a session: one fabric, three libraries in turn.
ports=$([ "$CFG" = 2port ] && echo p0,p1 || echo p0)
lanes=$([ "$CFG" = 2port ] && echo 2 || echo 1)
a0=$($netlab addr "$NETLAB_NAME" h0)
a1=$($netlab addr "$NETLAB_NAME" h1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
perfargs=(-C allreduce -b "$SIZE" -e "$SIZE" -d float -o sum -n "$ITERS" -w 1)
# busbw from the out-of-place time column (c4-perf prints GB/s with two decimals only); the AllReduce
# busbw factor on 2 ranks is 2(n-1)/n = 1.
busbw() { awk '/^ +[0-9]+ +[0-9]+ +float/ {printf "%.4f\n", $1 / ($6 * 1e3); exit}' "$1"; }

run_pair() {  # name cmd...: runs the command as rank 0 on h0 and rank 1 on h1
  local name=$1; shift
  for r in 0 1; do
    $netlab run "$NETLAB_NAME" "h$r" -- env RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR="$a0" MASTER_PORT=29500 \
      C4_SOCKET_IFNAME=p0 C4_TCP_PORTS="$ports" C4_LANES="$lanes" C4_GLOO_STORE="$tmp/store-$name" \
      C4_GLOO_HOSTNAME="$([ $r = 0 ] && echo "$a0" || echo "$a1")" "$@" > "$tmp/$name.$r" 2>&1 &
  done
  wait
}

mkdir -p "$tmp/store-gloo"
run_pair c4 "$bin/c4-perf" "${perfargs[@]}"
run_pair gloo "$bin/c4-peer-gloo" "${perfargs[@]}"
# Open MPI: mpirun in h0 starts the ranks through an rsh agent that enters each host's namespace;
# the tcp BTL only (no shared memory between the emulated hosts).
agent="$tmp/nsrsh"
printf '#!/bin/sh\nh=$1; shift\nexec ip netns exec "nl-%s-$h" sh -c "$*"\n' "$NETLAB_NAME" > "$agent"
chmod +x "$agent"
$netlab run "$NETLAB_NAME" h0 -- mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 --host h0:1,h1:1 \
  --mca plm_rsh_agent "$agent" --mca btl tcp,self --mca btl_tcp_if_include p0 --mca oob_tcp_if_include p0 \
  "$bin/c4-peer-mpi" "${perfargs[@]}" > "$tmp/mpi.0" 2>&1 || echo "(Open MPI run failed: $(tail -2 "$tmp/mpi.0"))"

rate_gbps=$("$py" -c "
import re,sys
m=re.match(r'([0-9.]+)([kmg]?)bit', sys.argv[1].lower())
v=float(m.group(1))*{'':1e-9,'k':1e-6,'m':1e-3,'g':1}[m.group(2)]
print(v/8)" "$RATE")
echo "== $CFG: 2 hosts, AllReduce $SIZE float sum, links $RATE (= $rate_gbps GB/s per direction), c4 lanes: $lanes"
for lib in c4 gloo mpi; do
  b=$(busbw "$tmp/$lib.0" || true)
  if [ -z "$b" ]; then echo "$lib: no result"; tail -3 "$tmp/$lib.0"; continue; fi
  "$py" -c "import sys; b=float(sys.argv[2]); print('%-5s busbw %.4f GB/s = %.2f x link rate' % (sys.argv[1], b, b/float(sys.argv[3])))" \
    "$lib" "$b" "$rate_gbps"
done
