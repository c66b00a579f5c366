# Sourced by the netlab test scripts: paths, and entering a fresh fabric.
#   netlab_enter [netlab session options] -- CMD...   re-runs CMD inside a new fabric, or exits 77
#                                                      (skipped, reason on stdout) without root/netns.
here=$(cd "$(dirname "$0")" && pwd)
tools=$(cd "$here/../../tools/netlab" && pwd)
py=/usr/bin/python3
[ -x "$py" ] || py=python3

netlab_enter() {
  "$py" - "$tools" <<'PYEOF' || exit $?
import sys
sys.path.insert(0, sys.argv[1])
import netlab
ok, why = netlab.netns_available()
if not ok:
    print("SKIPPED: " + why)
sys.exit(0 if ok else 77)
PYEOF
  exec "$py" "$tools/netlab" session "$@"
}

# netlab_run_ranks HOSTS RANKS_PER_HOST OUTDIR CMD...: starts rank h*RANKS_PER_HOST+l on host h with
# the torchrun variables (root on h0, C4_SOCKET_IFNAME=p0), output in OUTDIR/out.RANK, and waits for
# all; prints the output of every rank that failed and returns 1 if any did. Inside a session.
netlab_run_ranks() {
  local hosts=$1 ranks=$2 out=$3
  shift 3
  local master pids=() r h l rc=0
  master=$("$tools/netlab" addr "$NETLAB_NAME" h0)
  for ((h = 0; h < hosts; h++)); do
    for ((l = 0; l < ranks; l++)); do
      r=$((h * ranks + l))
      "$tools/netlab" run "$NETLAB_NAME" "h$h" -- env RANK=$r LOCAL_RANK=$l WORLD_SIZE=$((hosts * ranks)) \
        MASTER_ADDR="$master" MASTER_PORT=29500 C4_SOCKET_IFNAME=p0 "$@" > "$out/out.$r" 2>&1 &
      pids+=($!)
    done
  done
  for r in "${!pids[@]}"; do
    if ! wait "${pids[$r]}"; then
      echo "rank $r failed:"; cat "$out/out.$r"; rc=1
    fi
  done
  return $rc
}

# spine_bytes: the bytes each spine of the fabric forwarded so far, "s0 s1 ...". Inside a session.
spine_bytes() {  # bytes each spine forwarded, "s0 s1"
  "$py" - "$tools" <<'PYEOF'
import os, sys
sys.path.insert(0, sys.argv[1])
import netlab
topo = netlab.load_topology(os.environ["NETLAB_TOPO"])
print(" ".join(str(sum(c["tx_bytes"] for c in netlab.iface_counters(s["netns"]).values())) for s in topo["spines"]))
PYEOF
}
