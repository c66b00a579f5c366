#!/usr/bin/env bash
# Installs what c4comm needs from Debian's packages (idempotent; skips apt when all is present).
set -euo pipefail
pkgs=(build-essential cmake pkg-config python3 libgtest-dev libgmock-dev libbenchmark-dev
      openmpi-bin libopenmpi-dev libgloo-dev iproute2 procps
      clang-format binutils  # the style suite; c++filt for the exported-symbol test
      nlohmann-json3-dev libglpk-dev  # C4P: the topology file; the planner tests' LP bound
      libsqlite3-dev  # C4P's fabric service (tools/c4-fabricd): its jobs and events
      python3-torch libtorch-dev pybind11-dev python3-pytest  # the torch backend (bindings/torch)
      python3-mpi4py  # c4comm_torch.comm_from_mpi and its test (tests/torch/test_interop.py)
      chromium  # the c4-trace report's screenshot test (tests/trace)
      clang libclang-rt-dev python3-venv  # the fuzz targets (scripts/fuzz.sh): libFuzzer; atheris's venv
      libucx-dev ucx-utils  # the ucx transport (transports/ucx) and ucx_perftest beside it (bench/ucx)
      coinor-cbc glpk-utils  # the MILP solvers c4-synth's solver comparison runs beside HiGHS (bench/synth)
      libibverbs-dev ibverbs-providers  # the ibverbs transport (transports/ibverbs; libibverbs is dlopen'ed)
      # its Soft-RoCE VM (tests/rdma-vm): Debian's kernel under qemu, rxe, perftest's ib_write_bw
      qemu-system-x86 busybox-static rdma-core ibverbs-utils perftest kmod cpio)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "[deps] all packages present"
fi
# NVIDIA's newest nccl.h, the reference of the ABI tests (tests/abi): ~50 KB read out of PyPI's
# nvidia-nccl-cu13 wheel with range requests, checked against a pinned SHA-256 (.deps/, ignored by git).
python3 "$(dirname "$0")/../tools/fetch_nccl_header.py" >/dev/null
# PyPI's PyTorch 2.x in a virtual environment (.venv-torch/, ignored by git), beside Debian's 1.13.
"$(dirname "$0")/torch-venv.sh"
# HiGHS (highspy), numpy and pytest for the schedule synthesizer tools/c4-synth (.venv-synth/, ignored by git).
"$(dirname "$0")/synth-venv.sh"
