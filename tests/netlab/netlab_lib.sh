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

# ---- concurrent 2-rank jobs (the fabric service's tests); inside a session, with $tmp set ----
addr() { "$tools/netlab" addr "$NETLAB_NAME" "$1"; }
# wait_for FILE PATTERN WHAT: until FILE has a line matching PATTERN (a hang guard of 120 s, not a margin).
wait_for() {
  local i
  for ((i = 0; i < 1200; i++)); do
    grep -q -- "$2" "$1" 2> /dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: no '$2' in $1 ($3) after 120 s"; cat "$1" 2> /dev/null; exit 1
}

# job_start NAME PORT HOST0 HOST1 ARGS...: a 2-rank job (rank 0 on HOST0, the root there on PORT),
# started in the background; its output in $tmp/NAME/out.RANK (the caller's $tmp), its pids in
# $tmp/NAME/pids.
job_start() {
  local name=$1 port=$2 h0=$3 h1=$4 r h
  shift 4
  mkdir -p "$tmp/$name"
  : > "$tmp/$name/pids"
  for r in 0 1; do
    h=$h0
    [ $r = 1 ] && h=$h1
    "$tools/netlab" run "$NETLAB_NAME" "$h" -- env RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR="$(addr "$h0")" \
      MASTER_PORT=$port C4_SOCKET_IFNAME=p0 "$@" > "$tmp/$name/out.$r" 2>&1 &
    echo $! >> "$tmp/$name/pids"
  done
}
# job_wait NAME: both ranks ended well and the results are right.
job_wait() {
  local pid rc=0
  for pid in $(cat "$tmp/$1/pids"); do wait "$pid" || rc=1; done
  if [ $rc != 0 ]; then
    cat "$tmp/$1/out.0" "$tmp/$1/out.1"; echo "FAIL: job $1 failed"; exit 1
  fi
  grep -q "Out of bounds values : 0 OK" "$tmp/$1/out.0" || { cat "$tmp/$1/out.0"; echo "FAIL: job $1: wrong results"; exit 1; }
}
# spine_of NAME: the spine job NAME's lane crosses, from rank 0's plan ("... lane 0: h0p0 -> spine1 -> h2p0 ...").
spine_of() { grep -A2 "C4P plan (lane" "$tmp/$1/out.0" | grep -m1 -o "spine[0-9]*" || echo "none"; }
# split S0 S1 LO: whether each spine carried at least LO% of their bytes.
split() { [ $(($1 * 100)) -ge $((($1 + $2) * $3)) ] && [ $(($2 * 100)) -ge $((($1 + $2) * $3)) ]; }
# fabric_job_env: what the fabric service's tests run every job with unless a job says otherwise:
# C4P over the session's topology, one lane, ring AllReduce, the plan logged, no rebalancing.
fabric_job_env() {
  export C4_PLANNER=c4p C4_TOPO_FILE=$NETLAB_TOPO C4_LANES=1 C4_ALGO=ring C4_TIMEOUT=${C4_TIMEOUT:-60} \
    C4_DEBUG=INFO C4_DEBUG_SUBSYS=PLAN C4_REBALANCE_MS=0
}
# fabric_cleanup: the EXIT trap of a script that keeps its files in $tmp and may have started
# c4-fabricd (its pid in $daemon).
fabric_cleanup() {
  [ -n "${daemon:-}" ] && kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null
  rm -rf "$tmp"
}
# iters NAME: the iterations job NAME's rank 0 ran and found right (c4-perf --timeline 1 -c 1).
iters() {
  local n
  n=$(grep -c "iteration.*right" "$tmp/$1/out.0" 2> /dev/null) || true
  echo "${n:-0}"
}
# wait_iters NAME N: until job NAME has run N right iterations (a hang guard of 120 s).
wait_iters() {
  local i
  for ((i = 0; i < 1200; i++)); do
    [ "$(iters "$1")" -ge "$2" ] && return 0
    grep -q "WRONG" "$tmp/$1/out.0" && break
    sleep 0.1
  done
  tail -40 "$tmp/$1/out.0"; echo "--- rank 1:"; tail -40 "$tmp/$1/out.1"
  echo "FAIL: job $1 did not reach $2 right iterations"; exit 1
}
# stop_job NAME: a job running until stopped is stopped; every iteration it ran was right.
stop_job() {
  local pid
  for pid in $(cat "$tmp/$1/pids"); do kill "$pid" 2> /dev/null || true; done
  for pid in $(cat "$tmp/$1/pids"); do wait "$pid" 2> /dev/null || true; done
  if grep -q "WRONG" "$tmp/$1/out.0" "$tmp/$1/out.1"; then echo "FAIL: job $1 saw wrong results"; exit 1; fi
  echo "job $1: $(iters "$1") iterations, every one right"
}
