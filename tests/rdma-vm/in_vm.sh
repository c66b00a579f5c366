#!/bin/sh
# Runs inside the Soft-RoCE VM (tests/rdma-vm/run.sh): the ibverbs tests over the VM's rxe0.
#   in_vm.sh all|setup|conformance|failover|hosts|twovm|twoport|matrix|bench [gtest filter]
WHAT=${1:-all}
FILTER=$2
cd /tmp
echo "[vm] $(ibv_devices | sed -n 3p | awk '{print $1}') up; running: $WHAT"
ibv_devinfo -d rxe0 | grep -E "state|active_mtu|link_layer" | sed 's/^/[vm] /'
export C4_TEST_QUICK=1  # the matrix's quick sizes: the VM emulates every instruction
rc=0
run() {
  echo "[vm] \$ $*"
  "$@" || rc=1
}
# The two-VM steps (run.sh twovm, twoport): this VM's host index H, and its NICs eth0..N-1 up on
# rail i's subnet 10.(78+i).0.0/24 with an rxe device rxn<i> each, once the other VM answers there.
H=$(sed -n 's/.*c4host=\([0-9]\).*/\1/p' /proc/cmdline)
nics_up() {
  insmod /mods/e1000.ko
  sleep 1
  for i in $(seq 0 $(($1 - 1))); do
    /bin/ip addr add 10.7$((8 + i)).0.$((H + 1))/24 dev eth$i
    /bin/ip link set eth$i up
  done
  sleep 2
  for i in $(seq 0 $(($1 - 1))); do
    rdma link add rxn$i type rxe netdev eth$i
    peer=10.7$((8 + i)).0.$((2 - H))
    for k in $(seq 120); do ping -c 1 -W 1 $peer > /dev/null 2>&1 && break; done
    echo "[vm] host $H: rxn$i on eth$i ($(ibv_devinfo -d rxn$i | grep -m1 state | awk '{print $2}')), $peer answers"
  done
}
# matrix_verdict STEP FAILED WHAT: c4-matrix's verdicts of this host's ranks (logs /tmp/STEP.*), and
# that both ran shm within the host and ibverbs to the other one.
matrix_verdict() {
  grep -h "^c4-matrix" /tmp/$1.* | sed 's/^/[vm]   /'
  grep -h "transports:" /tmp/$1.* | sed 's/^.* pid [0-9]*: /[vm]   /'
  if [ "$2" -ne 0 ] || [ "$(grep -l 'transports: shm+ibverbs' /tmp/$1.* | wc -l)" -ne 2 ]; then
    # The host shows only [vm] lines of the console: prefix what explains the failure.
    echo "[vm] $1: FAILED"; grep -h -E "RDMA|ibverbs|C4P|error|failed|FAIL|wrong" /tmp/$1.* | head -40 |
      sed 's/^/[vm]   /'; rc=1
  else
    echo "[vm] $1: ok (host $H: $3, every result right)"
  fi
}
case "$WHAT" in
  setup | all) run /c4/ibverbs_test ;;
esac
case "$WHAT" in
  conformance | all) run /c4/transport_conformance_test --gtest_filter="${FILTER:-*/ibverbs}" ;;
esac
case "$WHAT" in
  failover | all)
    # A queue pair put into the error state under traffic (C4_FAULT=drop: rank 0's lane 1 to rank 1
    # before collective 3, as a NIC fault would): its chunks go again on lane 0, both ends retire
    # it, and every AllReduce's result is still checked right (c4-perf -c 1).
    echo "[vm] \$ C4_FAULT=drop:rank=0,peer=1,lane=1,op=3 c4-perf -np 2 over ibverbs"
    C4_TRANSPORT=ibverbs C4_FAULT=drop:rank=0,peer=1,lane=1,op=3 C4_TRACE=0 C4_DEBUG=WARN \
      /c4/c4-perf -np 2 -C allreduce -b 4M -e 4M -n 20 -w 2 -c 1 > /tmp/failover.log 2>&1
    frc=$?
    grep -E "retired|C4_FAULT|#  Out of bounds|wrong" /tmp/failover.log | sed 's/^/[vm]   /'
    if [ $frc -ne 0 ] || ! grep -q "lane 1 to rank 1 (rxe0:1) retired" /tmp/failover.log ||
       ! grep -q "lane 1 to rank 0 (rxe0:1) retired" /tmp/failover.log || ! grep -q "Out of bounds values : 0 OK" /tmp/failover.log; then
      echo "[vm] failover: FAILED (exit $frc)"; tail -20 /tmp/failover.log; rc=1
    else
      echo "[vm] failover: ok (both ends retired lane 1, results right)"
    fi
    ;;
esac
case "$WHAT" in
  hosts | all)
    # Two emulated hosts (network namespaces joined by a veth pair), two ranks each, launched the way
    # torchrun does. Each host gets an rxe device, but Debian 6.1's rxe cannot be moved into a
    # namespace ("Operation not supported"; its UDP socket lives in the first one), so with RDMA
    # devices private to their namespace (exclusive mode) the hosts' namespaces have none: under
    # C4_TRANSPORT=auto every rank must find that, all must fall back to tcp together (one INFO
    # line each), and the collective matrix must pass across the hosts.
    rdma system set netns exclusive
    for h in 0 1; do /bin/ip netns add h$h; /bin/ip -n h$h link set lo up; done
    /bin/ip link add e0 netns h0 type veth peer name e1 netns h1
    for h in 0 1; do
      /bin/ip -n h$h addr add 10.77.0.$((h + 1))/24 dev e$h
      /bin/ip -n h$h link set e$h up
    done
    sleep 2
    for h in 0 1; do
      /bin/ip netns exec h$h rdma link add rxh$h type rxe netdev e$h
      rdma dev set rxh$h netns h$h 2>&1 | sed "s/^/[vm] moving rxh$h into h$h: /"
    done
    pids=""
    for r in 0 1 2 3; do
      h=$((r / 2))
      /bin/ip netns exec h$h env RANK=$r LOCAL_RANK=$((r % 2)) WORLD_SIZE=4 MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 \
        C4_SOCKET_IFNAME=e$h C4_TRANSPORT=auto C4_DEBUG=INFO C4_DEBUG_SUBSYS=INIT C4_TRACE=0 \
        /c4/c4-matrix --quick > /tmp/hosts.$r 2>&1 &
      pids="$pids $!"
    done
    hrc=0
    for p in $pids; do wait $p || hrc=1; done
    grep -h "^c4-matrix" /tmp/hosts.* | sed 's/^/[vm]   /'
    if [ $hrc -ne 0 ] || [ "$(grep -l 'not using RDMA between hosts' /tmp/hosts.* | wc -l)" -ne 4 ] ||
       [ "$(grep -l 'transports: shm+tcp' /tmp/hosts.* | wc -l)" -ne 4 ]; then
      echo "[vm] hosts: FAILED"; grep -h -E "RDMA|transports:|error|FAIL" /tmp/hosts.* | head -20 | sed 's/^/[vm]   /'; rc=1
    else
      echo "[vm] hosts: ok (2 hosts x 2 ranks without a device in their namespaces: all fell back to shm+tcp, results right)"
    fi
    ;;
esac
case "$WHAT" in
  twovm)
    # One of two VMs (run.sh twovm): this host's e1000 NIC joins the other VM's; an rxe device on it;
    # ranks 2H and 2H+1 of a 4-rank job launched the way torchrun does. Under C4_TRANSPORT=auto the
    # ranks of this host talk over shm and the hosts over ibverbs (RDMA between two kernels); the
    # collective matrix checks every result.
    nics_up 1
    # C4P plans the lanes between the hosts on twovm_topo.json: each VM's NIC hangs off a leaf of its
    # own, two spines between the leaves, steered by RoCE source ports 50000-50999 (spine0) and
    # 51000-51999 (spine1); each lane asks for its planned port through its flow label. Lanes no
    # plan covers (connections that carry no AllReduce traffic) leave from C4_IB_SOURCE_PORT_BASE +
    # lane (60000, 60001). Host 0 records the RoCE packets on its NIC meanwhile. Before its 40th
    # collective rank 0 breaks its lane 0 to rank 2 (C4_FAULT=drop: the queue pair errs, as a NIC
    # fault would): both ends retire it, and C4P replaces it on a path that avoids spine0's links
    # (addLane: a queue pair exchanged over the live lane), so lane 2 runs through spine1.
    [ "$H" = 0 ] && { /c4/c4-udp-sports eth0 100000 > /tmp/sports 2>&1 & cap=$!; }
    pids=""
    for l in 0 1; do
      r=$((2 * H + l))
      env RANK=$r LOCAL_RANK=$l WORLD_SIZE=4 MASTER_ADDR=10.78.0.1 MASTER_PORT=29500 C4_SOCKET_IFNAME=eth0 \
        C4_TRANSPORT=auto C4_IB_HCA==rxn0 C4_IB_SOURCE_PORT_BASE=60000 C4_TOPO_FILE=/c4/twovm_topo.json \
        C4_FAULT=drop:rank=0,peer=2,lane=0,op=40 \
        C4_DEBUG=INFO C4_DEBUG_SUBSYS=INIT,NET,PLAN \
        C4_TRACE=0 C4_TIMEOUT=300 /c4/c4-matrix --quick > /tmp/twovm.$r 2>&1 &
      pids="$pids $!"
    done
    trc=0
    for p in $pids; do wait $p || trc=1; done
    if [ "$H" = 0 ]; then
      kill -TERM $cap 2> /dev/null; wait $cap 2> /dev/null
    fi
    matrix_verdict twovm $trc "shm within, ibverbs to the other VM"
    # Every lane of this host's ranks: a planned one leaves from a port of its spine's range, an
    # unplanned one from 60000 + lane; both spines carry planned lanes.
    grep -h "ibverbs: rank .*: lane .* udp source port" /tmp/twovm.* |
      sed 's/^.*ibverbs: rank \([0-9]*\): lane \([0-9]*\) to rank \([0-9]*\): .* udp source port \([0-9]*\)\(.*\)$/\1 \2 \3 \4 \5/' |
      awk '{ path = ($5 == "") ? "none" : ($0 ~ /spine0/ ? "spine0" : $0 ~ /spine1/ ? "spine1" : "other"); print $1, $2, $3, $4, path }' > /tmp/lanes
    sed 's/^/[vm]   lane (rank, lane, peer, source port, spine): /' /tmp/lanes
    bad=$(awk '($5 == "spine0" && ($4 < 50000 || $4 > 50999)) || ($5 == "spine1" && ($4 < 51000 || $4 > 51999)) ||
               ($5 == "none" && $4 != 60000 + $2) || $5 == "other"' /tmp/lanes)
    # The replacement of rank 0's lane 0 to rank 2, at both ends, through spine1.
    if [ "$H" = 0 ]; then added=$(awk '$1 == 0 && $2 == 2 && $3 == 2 && $5 == "spine1"' /tmp/lanes); else
      added=$(awk '$1 == 2 && $2 == 2 && $3 == 0 && $5 == "spine1"' /tmp/lanes); fi
    grep -h -E "retired|adding lane" /tmp/twovm.* | sed 's/^.* c4 [A-Z]* /[vm]   /'
    if [ -z "$added" ]; then echo "[vm] failover: FAILED (no lane 2 between ranks 0 and 2 through spine1)"; rc=1; else
      echo "[vm] failover: ok (lane 0 between ranks 0 and 2 retired, lane 2 added through spine1: $added)"; fi
    if [ -z "$bad" ] && grep -q " spine0$" /tmp/lanes && grep -q " spine1$" /tmp/lanes; then
      echo "[vm] planned lanes: ok (each planned lane asked for a source port of its spine's range; both spines used)"
    else
      echo "[vm] planned lanes: FAILED ${bad:-(a spine carries no planned lane)}"; grep -h "C4P" /tmp/twovm.* | head -20; rc=1
    fi
    if [ "$H" = 0 ]; then
      sed 's/^/[vm]   RoCE packets on eth0: /' /tmp/sports
      # On the wire: only the lanes' ports (both directions of a lane use the lower rank's), and
      # planned ones through both spines.
      awk '{print $4}' /tmp/lanes | sort -u > /tmp/lane_ports
      sed -n 's/^sport \([0-9]*\):.*/\1/p' /tmp/sports | sort -u > /tmp/wire_ports
      stray=$(comm -13 /tmp/lane_ports /tmp/wire_ports | tr '\n' ' ')
      if [ -z "$stray" ] && grep -q "^50[0-9][0-9][0-9]$" /tmp/wire_ports && grep -q "^51[0-9][0-9][0-9]$" /tmp/wire_ports; then
        echo "[vm] source ports: ok (on the wire exactly the lanes' ports: $(tr '\n' ' ' < /tmp/wire_ports))"
      else
        echo "[vm] source ports: FAILED (on the wire but no lane's: ${stray:-none}; or a spine's range unused)"; rc=1
      fi
    fi
    ;;
esac
case "$WHAT" in
  twoport)
    # One of two VMs (run.sh twoport), each with two NICs on two rails (eth0 on 10.78.0.0/24, eth1 on
    # 10.79.0.0/24, one emulated link per rail between the VMs), an rxe device on each (rxn0, rxn1):
    # a host with a two-port RDMA NIC, as far as the transport sees. twoport_topo.json puts each rail
    # on a leaf of its own with rail 1 twice as fast, so C4P plans the three lanes of each connection
    # that carries AllReduce traffic as one on port 0 and two on port 1, the opposite of what the
    # transport does unplanned (lane l on port l mod 2: two on port 0). Checked here: every such
    # lane's queue pair was made on the device of its planned port and connected to the peer's
    # device on the same rail (its GIDs), at both ends; and on host 0's two NICs, RoCE packets
    # addressed to the planned lanes' queue pairs, on each NIC only those of its own lanes.
    nics_up 2
    if [ "$H" = 0 ]; then
      /c4/c4-udp-sports eth0 100000 > /tmp/wire0 2>&1 &
      cap0=$!
      /c4/c4-udp-sports eth1 100000 > /tmp/wire1 2>&1 &
      cap1=$!
    fi
    pids=""
    for l in 0 1; do
      r=$((2 * H + l))
      env RANK=$r LOCAL_RANK=$l WORLD_SIZE=4 MASTER_ADDR=10.78.0.1 MASTER_PORT=29500 C4_SOCKET_IFNAME=eth0 \
        C4_TRANSPORT=auto C4_IB_HCA=rxn C4_IB_QPS_PER_CONNECTION=3 C4_TOPO_FILE=/c4/twoport_topo.json \
        C4_DEBUG=INFO C4_DEBUG_SUBSYS=INIT,NET,PLAN C4_TRACE=0 C4_TIMEOUT=300 /c4/c4-matrix --quick > /tmp/twoport.$r 2>&1 &
      pids="$pids $!"
    done
    prc=0
    for p in $pids; do wait $p || prc=1; done
    if [ "$H" = 0 ]; then
      kill -TERM $cap0 $cap1 2> /dev/null
      wait $cap0 $cap1 2> /dev/null
    fi
    matrix_verdict twoport $prc "shm within, ibverbs over both NICs to the other VM"
    # The lanes of this host's ranks: rank lane peer device local-address local-qp remote-address
    # remote-qp planned-path ("-": not planned).
    grep -h "ibverbs: rank .*: lane .* udp source port" /tmp/twoport.* |
      sed 's/^.*ibverbs: rank \([0-9]*\): lane \([0-9]*\) to rank \([0-9]*\): \([a-z0-9]*\):[0-9]* \([0-9.]*\) qp \(0x[0-9a-f]*\) -> \([0-9.]*\) qp \(0x[0-9a-f]*\), udp source port [^;]*\(.*\)$/\1 \2 \3 \4 \5 \6 \7 \8 \9/' |
      awk '{ path = ($9 == "") ? "-" : $0; sub(/^.*C4P path /, "", path); gsub(/ /, "", path); print $1, $2, $3, $4, $5, $6, $7, $8, path }' > /tmp/lanes
    sed 's/^/[vm]   lane (rank, lane, peer, device, from, qp, to, qp, C4P path): /' /tmp/lanes
    # A planned lane: its device is the port of its path at this host (hHpI: rxnI), both addresses
    # on that rail. Per connection: one planned lane on rxn0 and two on rxn1.
    bad=$(awk -v h="$H" '$9 != "-" { i = substr($4, 4); want = "h" h "p" i;
            if (index($9, want) == 0 || index($5, "10.7" (8 + i) ".") != 1 || index($7, "10.7" (8 + i) ".") != 1) print }' /tmp/lanes)
    split=$(awk '$9 != "-" { n[$1 "-" $3 " " $4]++; c[$1 "-" $3] = 1 }
                 END { for (k in c) printf "%s:%d/%d ", k, n[k " rxn0"], n[k " rxn1"] }' /tmp/lanes)
    odd=$(echo "$split" | tr ' ' '\n' | grep -v '^$' | grep -v ':1/2$' || true)
    if [ -z "$bad" ] && [ -n "$split" ] && [ -z "$odd" ]; then
      echo "[vm] planned ports: ok (per connection rxn0/rxn1 lanes: $split; each on its planned port's rail)"
    else
      echo "[vm] planned ports: FAILED (connections rxn0/rxn1: ${split:-none}; lanes off their port: ${bad:-none})"; rc=1
    fi
    if [ "$H" = 0 ]; then
      sed 's/^/[vm]   RoCE on eth0: /' /tmp/wire0 | grep -v " qp " ; sed 's/^/[vm]   RoCE on eth1: /' /tmp/wire1 | grep -v " qp "
      # Each planned lane's packets in both directions (to the peer's queue pair, and to this
      # one's) on its own NIC only.
      wrong="" seen0=0 seen1=0
      while read -r rank lane peer dev from lqp to rqp path; do
        [ "$path" = "-" ] && continue
        i=${dev#rxn}
        o=$((1 - i))
        mine=$(awk -v a="to $to qp $rqp:" -v b="to $from qp $lqp:" 'index($0, a) == 1 || index($0, b) == 1 {n += $(NF - 1)} END {print n + 0}' /tmp/wire$i)
        other=$(awk -v a="to $to qp $rqp:" -v b="to $from qp $lqp:" 'index($0, a) == 1 || index($0, b) == 1 {n += $(NF - 1)} END {print n + 0}' /tmp/wire$o)
        echo "[vm]   rank $rank lane $lane to rank $peer ($dev): $mine packets on eth$i, $other on eth$o"
        [ "$other" -ne 0 ] && wrong="$wrong rank$rank/lane$lane"
        [ "$mine" -gt 0 ] && eval "seen$i=\$((seen$i + 1))"
      done < /tmp/lanes
      if [ -z "$wrong" ] && [ "$seen0" -gt 0 ] && [ "$seen1" -gt 0 ]; then
        echo "[vm] wire: ok (planned lanes carried packets on both NICs, each only on its own: $seen0 on eth0, $seen1 on eth1)"
      else
        echo "[vm] wire: FAILED (on the other NIC:${wrong:- none}; lanes with packets: $seen0 on eth0, $seen1 on eth1)"; rc=1
      fi
    fi
    ;;
esac
case "$WHAT" in
  # Each rank count once, odd and even, plain ibverbs and mixed with shm: 2 ranks on two emulated
  # hosts, 3 ranks over ibverbs alone, 4 ranks mixed. (The host runs every count of every transport;
  # here every instruction is emulated, and the other three cases took 137 s of 262.)
  matrix | all) run /c4/coll_test --gtest_filter="${FILTER:-Net/NetMatrix.*ibverbs_mixed_np2:Net/NetMatrix.*ibverbs_np3:Net/NetMatrix.*ibverbs_mixed_np4:AutoTransport.*}" ;;
esac
case "$WHAT" in
  bench)
    # 1. One-way bandwidth on the same rxe0, 4 MiB messages: ib_write_bw (RDMA writes, perftest's
    #    MB = 2^20 B) and c4-p2p-bw over C4_TRANSPORT=ibverbs (200 messages, 16 in flight).
    # 2. AllReduce, 2 ranks: c4 over ibverbs vs c4 over its tcp transport (same VM, same run).
    export C4_TRACE=0
    for k in 1 2 3; do
      (ib_write_bw -d rxe0 -x 1 -s 4194304 -n 200 > /tmp/srv.log 2>&1 &)
      sleep 1
      theirs=$(ib_write_bw -d rxe0 -x 1 -s 4194304 -n 200 192.168.77.1 2>/dev/null | awk '$1 == 4194304 {print $4}')
      sleep 1
      ours=$(C4_TRANSPORT=ibverbs /c4/c4-p2p-bw 4M 200 16 20 | awk '{print $(NF-7)}')
      echo "[vm] bench run $k: ib_write_bw $theirs MB/s; c4 over ibverbs $ours MB/s;" \
           "ratio $(awk -v a="$ours" -v b="$theirs" 'BEGIN{printf "%.3f", a/b}')"
    done
    for t in ibverbs tcp; do
      echo "[vm] AllReduce over $t:"
      C4_TRANSPORT=$t /c4/c4-perf -np 2 -C allreduce -b 1M -e 16M -f 4 -n 10 -w 2 | grep -vE "^#|^$" | sed 's/^/[vm]   /'
    done
    ;;
esac
exit $rc
