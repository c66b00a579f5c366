#!/bin/sh
# Runs inside the Soft-RoCE VM (tests/rdma-vm/run.sh): the ibverbs tests over the VM's rxe0.
#   in_vm.sh all|setup|conformance|failover|matrix|bench [gtest filter]
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
  matrix | all) run /c4/coll_test --gtest_filter="${FILTER:-Net/NetMatrix.*ibverbs*:AutoTransport.*}" ;;
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
