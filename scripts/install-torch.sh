#!/usr/bin/env bash
# Builds c4comm's torch backend and installs the package c4comm_torch (with libc4comm.so beside
# its module) into the site-packages of the interpreter that has torch:
#   scripts/install-torch.sh                 # /usr/bin/python3 (Debian's torch)
#   PYTHON=/path/to/python3 scripts/install-torch.sh
# Then, from anywhere: python3 -c "import c4comm_torch" registers backend "c4".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD_DIR=${BUILD_DIR:-build}
"$PYTHON" -c "import torch" || { echo "[install-torch] $PYTHON has no torch (apt install python3-torch libtorch-dev pybind11-dev)" >&2; exit 1; }
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} -DC4_WITH_TORCH=ON \
      -DC4_TORCH_PYTHON="$PYTHON" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target c4comm_torch
SITE=${SITE:-$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')}
DEST="$SITE/c4comm_torch"
mkdir -p "$DEST"
cp "$BUILD_DIR"/python/c4comm_torch/__init__.py "$BUILD_DIR"/python/c4comm_torch/_C*.so "$DEST"/
# The module finds libc4comm through its RUNPATH $ORIGIN; c4comm_torch.nccl_library() is the
# libnccl.so.2 beside it (the NCCL API on a group's communicator).
cp -P "$BUILD_DIR"/lib/libc4comm.so.* "$BUILD_DIR"/lib/libnccl.so.2* "$DEST"/
(cd / && PYTHONPATH="$SITE" "$PYTHON" -c "import c4comm_torch, torch.distributed as d; assert hasattr(d.Backend, 'C4'); print('[install-torch] c4comm_torch installed in $DEST')")
