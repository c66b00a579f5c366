#!/usr/bin/env bash
# The shm transport on a small /dev/shm (a container's is often 64 MiB): every collective still runs
# and checks out. A /dev/shm with room for small rings gets small rings; one with room for none sends
# same-host ranks over the network transport, with one warning. Before, the rings' pages were
# touched beyond the space and the ranks died of SIGBUS. Runs in a mount namespace of its own with
# a tmpfs of the given size on /dev/shm (root; the host's /dev/shm is untouched).
#   small_devshm.sh C4PERF
set -euo pipefail
perf=${1:?usage: small_devshm.sh C4PERF}
if [ "$(id -u)" -ne 0 ]; then
  echo "small_devshm: needs root (a mount namespace with its own /dev/shm)" >&2
  exit 77
fi
inner() {  # inner SIZE NP COLLECTIVE EXPECT: in the new mount namespace
  mount -t tmpfs -o "size=$1" tmpfs /dev/shm
  out=$(C4_DEBUG=INFO C4_TIMEOUT=60 timeout 120 "$perf" -np "$2" -C "$3" -b 8 -e 4M -f 8 -n 2 -w 1 -c 1 2>&1) || {
    echo "$out" | tail -20
    echo "small_devshm: c4-perf -np $2 -C $3 failed with /dev/shm of $1" >&2
    exit 1
  }
  echo "$out" | grep -q "Out of bounds values : 0 OK" || { echo "$out" | tail; echo "no result check" >&2; exit 1; }
  echo "$out" | grep -q "$4" || { echo "$out" | grep -i shm | head; echo "small_devshm: expected '$4' with /dev/shm of $1" >&2; exit 1; }
  echo "small_devshm: /dev/shm $1, $2 ranks, $3: ok ($4)"
}
export -f inner
export perf
# Room for small rings only (8 ranks: 64 rings): shm with small slots.
unshare -m bash -c 'inner 16m 8 alltoall "ring slots of 16 KiB"'
# No room for any ring: the network transport carries them.
unshare -m bash -c 'inner 1m 4 allreduce "talk over the network transport"'
unshare -m bash -c 'inner 256k 3 allgather "transports: tcp"'
# Plenty of room: the usual slots, no warning.
unshare -m bash -c 'inner 256m 4 allreduce "transports: shm"'
