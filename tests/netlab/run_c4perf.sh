#!/usr/bin/env bash
# c4-perf ranks spread over emulated hosts of a netlab fabric (torchrun-style variables, one network
# namespace per host, C4_SOCKET_IFNAME=p0): results must be right on every rank, and the ranks on
# different hosts must have talked through the fabric (bytes on the leaves), not through shared memory.
#   run_c4perf.sh C4PERF HOSTS PORTS RANKS_PER_HOST
# Exit 77 (skipped) without root or network namespaces.
set -euo pipefail
. "$(dirname "$0")/netlab_lib.sh"

if [ -z "${NETLAB_NAME:-}" ]; then
  [ $# -eq 4 ] || { echo "usage: $0 C4PERF HOSTS PORTS RANKS_PER_HOST" >&2; exit 2; }
  netlab_enter --hosts "$2" --ports "$3" --leaves 2 --spines 2 --rate 1gbit \
    -- "$0" "$@"
fi

# Inside the session.
perf=$1 hosts=$2 ranks=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
leaf_bytes() {
  "$py" - "$tools" <<'EOF'
import os, sys
sys.path.insert(0, sys.argv[1])
import netlab
topo = netlab.load_topology(os.environ["NETLAB_TOPO"])
print(sum(c["rx_bytes"] for l in topo["leaves"] for c in netlab.iface_counters(l["netns"]).values()))
EOF
}
before=$(leaf_bytes)
rc=0
netlab_run_ranks "$hosts" "$ranks" "$tmp" C4_TIMEOUT="${C4_TIMEOUT:-60}" \
  "$perf" -C allreduce -b 8 -e 4M -f 8 -c 1 -n 2 -w 1 || rc=1
after=$(leaf_bytes)
cat "$tmp/out.0"
echo "fabric: $hosts hosts x $3 ports, $ranks ranks per host; leaves received $((after - before)) bytes"
[ $rc -eq 0 ] || exit 1
grep -q "Out of bounds values : 0 OK" "$tmp/out.0" || { echo "rank 0 reported wrong results"; exit 1; }
# Allreduce of 4 MiB between hosts moves at least that much through the leaves.
[ $((after - before)) -ge $((4 * 1024 * 1024)) ] || { echo "ranks on different hosts did not use the fabric"; exit 1; }
