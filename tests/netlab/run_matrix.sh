#!/usr/bin/env bash
# The collective test matrix (c4-matrix) with ranks spread over emulated hosts of a netlab fabric:
# tcp between hosts (C4_TCP_PORTS: every NIC port of a host, one lane per port), shm inside a host,
# and the hierarchical AllReduce where the tuner picks it (or C4_ALGO forces it).
#   run_matrix.sh C4MATRIX HOSTS PORTS RANKS_PER_HOST [extra c4-matrix args]
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -ge 4 ] || { echo "usage: $0 C4MATRIX HOSTS PORTS RANKS_PER_HOST [args]" >&2; exit 2; }
  netlab_enter --hosts "$2" --ports "$3" --leaves 2 --spines 2 --rate 2gbit -- "$0" "$@"
fi

matrix=$1 hosts=$2 ports=$3 ranks=$4
shift 4
world=$((hosts * ranks))
master=$("$tools/netlab" addr "$NETLAB_NAME" h0)
portlist=$(seq -s, -f 'p%g' 0 $((ports - 1)))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
for ((h = 0; h < hosts; h++)); do
  for ((l = 0; l < ranks; l++)); do
    r=$((h * ranks + l))
    "$tools/netlab" run "$NETLAB_NAME" "h$h" -- env RANK=$r LOCAL_RANK=$l WORLD_SIZE=$world MASTER_ADDR="$master" \
      MASTER_PORT=29500 C4_SOCKET_IFNAME=p0 C4_TCP_PORTS="$portlist" C4_LANES="$ports" \
      C4_TIMEOUT="${C4_TIMEOUT:-120}" "$matrix" "$@" > "$tmp/out.$r" 2>&1 &
    pids+=($!)
  done
done
rc=0
for r in "${!pids[@]}"; do
  if ! wait "${pids[$r]}"; then
    echo "rank $r failed:"; cat "$tmp/out.$r"; rc=1
  fi
done
cat "$tmp"/out.* | grep -E "^c4-matrix" || true
echo "fabric: $hosts hosts x $ports ports, $ranks ranks per host"
exit $rc
