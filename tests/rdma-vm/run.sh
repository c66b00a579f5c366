#!/usr/bin/env bash
# The ibverbs transport over real verbs: Debian's own kernel under qemu with Soft-RoCE
# (rdma_rxe), booted from a small initramfs that holds this build's test binaries. This machine's
# kernel has no RDMA; the VM's has, so the queue pairs, memory registrations, RDMA writes with
# immediate and completion errors below are the kernel's real ones (emulated NIC, real verbs).
#
#   tests/rdma-vm/run.sh BUILD_DIR [all|setup|conformance|failover|hosts|twovm|twoport|matrix|bench] [filter]
#   (all = every step but bench; twovm boots two VMs joined by an emulated e1000 link: two hosts with
#   an rxe device each, two ranks each, RDMA between them; twoport the same with two NICs per VM, each
#   with its rxe device, on two rails: lanes on the NIC ports C4P planned)
#   C4_RDMA_VM_ENV=C4_DEBUG=INFO,C4_IB_TIMEOUT=14 ...   (variables for the tests in the VM)
#
# Needs the packages scripts/deps.sh installs (qemu-system-x86, busybox-static, rdma-core,
# ibverbs-providers, ibverbs-utils, perftest, kmod, cpio) and root (none of it touches the host's
# network: the VM has no network device; its veth pair and rxe device live inside it). Downloads
# Debian's kernel package once into BUILD_DIR/rdma-vm. Prints the VM's console; exits with the
# tests' status (77: the packages are missing, so the ctest shows as skipped).
set -euo pipefail
B=$(cd "${1:?usage: run.sh BUILD_DIR [all|setup|conformance|failover|hosts|twovm|twoport|matrix|bench] [filter]}" && pwd)
WHAT=${2:-all}
FILTER=${3:-}
W=${C4_RDMA_VM_DIR:-$B/rdma-vm}
HERE=$(cd "$(dirname "$0")" && pwd)

need=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils perftest kmod cpio iproute2)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "rdma-vm: missing packages: ${missing[*]} (scripts/deps.sh installs them)" >&2
  exit 77
fi
[ "$(id -u)" -eq 0 ] || { echo "rdma-vm: needs root (insmod inside the VM is fine; building /dev nodes is not)" >&2; exit 77; }

mkdir -p "$W"
cd "$W"
# Debian's kernel image: the one linux-image-amd64 points at, fetched once.
if ! ls kernel/boot/vmlinuz-* >/dev/null 2>&1; then
  echo "[rdma-vm] fetching Debian's kernel package (once)"
  KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  rm -f ./*.deb
  apt-get download "$KPKG" >/dev/null 2>&1 || { apt-get update -qq && apt-get download "$KPKG" >/dev/null; }
  rm -rf kernel && mkdir kernel && dpkg -x ./*.deb kernel && rm -f ./*.deb
fi
KVER=$(ls kernel/lib/modules | head -1)
M=kernel/lib/modules/$KVER/kernel

echo "[rdma-vm] building the initramfs (kernel $KVER)"
rm -rf ir && mkdir -p ir/{bin,lib,lib64,mods,proc,sys,dev,tmp,run,c4,etc/libibverbs.d,usr/lib/x86_64-linux-gnu/libibverbs}
cp /usr/bin/busybox ir/bin/
for m in crypto/crc32_generic net/ipv4/udp_tunnel net/ipv6/ip6_udp_tunnel drivers/infiniband/core/ib_core \
         drivers/infiniband/core/ib_uverbs drivers/infiniband/sw/rxe/rdma_rxe drivers/net/veth \
         drivers/net/ethernet/intel/e1000/e1000; do
  f=$(ls "$M/$m".ko* | head -1)
  case "$f" in *.xz) xz -dc "$f" > "ir/mods/$(basename "$m").ko" ;; *) cp "$f" ir/mods/ ;; esac
done
withLibs() {  # copies binaries or libraries and everything they load into ir/lib
  for b in "$@"; do
    ldd "$b" 2>/dev/null | awk '/=>/{print $3}' | while read -r l; do [ -f "$l" ] && cp -nL "$l" ir/lib/; done
  done
}
tools=(/usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ib_write_bw /usr/bin/rdma /usr/sbin/ip)
cp "${tools[@]}" ir/bin/
withLibs "${tools[@]}"
VERBS=$(ls /usr/lib/x86_64-linux-gnu/libibverbs.so.1* | head -1)
cp -L "$VERBS" ir/lib/libibverbs.so.1
withLibs "$VERBS"
cp /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so ir/usr/lib/x86_64-linux-gnu/libibverbs/
withLibs /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so
cp /etc/libibverbs.d/rxe.driver ir/etc/libibverbs.d/
cp -L /lib64/ld-linux-x86-64.so.2 ir/lib64/
bins=()
for t in ibverbs_test transport_conformance_test coll_test c4-matrix c4-perf c4-p2p-bw c4-udp-sports; do
  [ -x "$B/bin/$t" ] && bins+=("$B/bin/$t")
done
cp "${bins[@]}" ir/c4/
withLibs "${bins[@]}"
cp "$HERE/in_vm.sh" "$HERE/twovm_topo.json" "$HERE/twoport_topo.json" ir/c4/
cat > ir/init <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/shm /dev/pts; mount -t tmpfs tmpfs /dev/shm; mount -t tmpfs tmpfs /tmp
export LD_LIBRARY_PATH=/lib PATH=/bin:/c4 HOME=/tmp
for m in crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe veth; do insmod /mods/$m.ko; done
# busybox's shell prefers its own applets (its 'ip' has no veth): iproute2 by absolute path
/bin/ip link set lo up
/bin/ip link add va type veth peer name vb
/bin/ip addr add 192.168.77.1/24 dev va; /bin/ip addr add 192.168.77.2/24 dev vb
/bin/ip link set va up; /bin/ip link set vb up; sleep 2  # the carrier is up before rxe binds
rdma link add rxe0 type rxe netdev va
WHAT=$(sed -n 's/.*c4what=\([^ ]*\).*/\1/p' /proc/cmdline)
for kv in $(sed -n 's/.*c4env=\([^ ]*\).*/\1/p' /proc/cmdline | tr ',' ' '); do export "$kv"; done
FILTER=$(sed -n 's/.*c4filter=\([^ ]*\).*/\1/p' /proc/cmdline)
sh /c4/in_vm.sh "$WHAT" "$FILTER"
echo "C4VM-RESULT rc=$?"
poweroff -f
INIT
chmod +x ir/init
(cd ir && find . | cpio -o -H newc 2>/dev/null | gzip -1 > ../initrd.gz)
LOG=$W/console.log
ACCEL=tcg  # KVM boots hung here; TCG works everywhere
# One virtual CPU: under TCG every guest instruction costs host CPU, and a second vCPU mostly
# emulates the ranks' polling (rdma_vm_ibverbs: 375 CPU-s with one, 524 with two, measured on 2
# cores); the ranks find the VM oversubscribed and stop spinning. C4_RDMA_VM_SMP=2 gives it two.
SMP=${C4_RDMA_VM_SMP:-1}
boot() {  # boot HOST_INDEX LOG [qemu network args...]
  local host=$1 log=$2
  shift 2
  timeout "${C4_RDMA_VM_TIMEOUT:-1500}" qemu-system-x86_64 -machine accel=$ACCEL -cpu max -m "${C4_RDMA_VM_MEM:-4096}" \
    -smp "$SMP" -kernel "kernel/boot/vmlinuz-$KVER" -initrd initrd.gz \
    -append "console=ttyS0 quiet panic=-1 no_timer_check c4what=$WHAT c4filter=$FILTER c4host=$host c4env=${C4_RDMA_VM_ENV:-}" \
    -nographic -no-reboot "$@" > "$log" 2>&1
}
result() { tr -d '\r' < "$1" | sed -n 's/^C4VM-RESULT rc=\([0-9]*\).*/\1/p' | tail -1; }
if [ "$WHAT" = twovm ] || [ "$WHAT" = twoport ]; then
  # Two VMs, one emulated e1000 NIC each (twoport: two, one per rail), joined by qemu's socket
  # network (a TCP stream per link between the two qemu processes on loopback: nothing of the host's
  # network is touched).
  echo "[rdma-vm] booting two VMs (qemu, software emulation; $(du -h initrd.gz | cut -f1) initramfs)"
  port=$((20000 + RANDOM % 20000))
  export C4_RDMA_VM_MEM=${C4_RDMA_VM_MEM:-2048}
  nic() {  # nic VM INDEX listen|connect: qemu arguments of the VM's NIC INDEX (eth INDEX inside)
    echo "-netdev socket,id=n$2,$3=127.0.0.1:$((port + $2)) -device e1000,netdev=n$2,mac=52:54:00:c4:0$2:0$(($1 + 1))"
  }
  nics0=$(nic 0 0 listen) nics1=$(nic 1 0 connect)
  if [ "$WHAT" = twoport ]; then nics0="$nics0 $(nic 0 1 listen)" nics1="$nics1 $(nic 1 1 connect)"; fi
  # shellcheck disable=SC2086  # the NICs' arguments are words
  boot 0 "$W/console0.log" $nics0 &
  vm0=$!
  sleep 2
  # shellcheck disable=SC2086
  boot 1 "$W/console1.log" $nics1 &
  vm1=$!
  wait $vm0 || true
  wait $vm1 || true
  for h in 0 1; do tr -d '\r' < "$W/console$h.log" | grep -a -E "^\[vm\]|^C4VM" | sed "s/^/[host $h] /"; done
  r0=$(result "$W/console0.log")
  r1=$(result "$W/console1.log")
  if [ -z "$r0" ] || [ -z "$r1" ]; then
    echo "rdma-vm: a VM ended without a result (consoles in $W/console0.log, console1.log)" >&2
    exit 1
  fi
  echo "[rdma-vm] result: $r0 $r1"
  [ "$r0" = 0 ] && [ "$r1" = 0 ]
  exit $?
fi
echo "[rdma-vm] booting (qemu, software emulation; $(du -h initrd.gz | cut -f1) initramfs)"
boot 0 "$LOG" -net none &
vm=$!
tail -f --pid=$vm "$LOG" 2>/dev/null | tr -d '\r' | grep --line-buffered -v '^\s*$' || true
wait $vm || true
rc=$(result "$LOG")
if [ -z "$rc" ]; then
  echo "rdma-vm: the VM ended without a result (timeout or crash; console in $LOG)" >&2
  exit 1
fi
echo "[rdma-vm] result: $rc"
exit "$rc"
