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
portlist=$(seq -s, -f 'p%g' 0 $((ports - 1)))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
netlab_run_ranks "$hosts" "$ranks" "$tmp" C4_TCP_PORTS="$portlist" C4_LANES="$ports" \
  C4_TIMEOUT="${C4_TIMEOUT:-120}" "$matrix" "$@" || rc=1
cat "$tmp"/out.* | grep -E "^c4-matrix" || true
echo "fabric: $hosts hosts x $ports ports, $ranks ranks per host"
exit $rc
