#!/usr/bin/env bash
# The virtual environment with PyPI's PyTorch 2.x that the build and the tests use beside Debian's
# torch 1.13 (.venv-torch/, ignored by git; docs/torch.md). Idempotent: kept when it already imports
# the pinned torch.
#
# The smallest install that imports torch and runs CPU collectives: torch's wheel without its
# dependency list (which pulls ~3 GB of CUDA libraries), its pure-Python dependencies, and of the
# CUDA libraries only those its modules link that the CUDA toolkit at /usr/local/cuda does not
# provide (cuSPARSELt, NVSHMEM, cuFile) or provides too old (NCCL: torch links ncclCommResume, which
# 13.0's NCCL 2.28 lacks). Where even that does not import (no CUDA toolkit on the machine), it falls
# back to torch with every dependency. Measured on the build machine (docs/torch.md): ~1.1 GB
# downloaded in ~10 s, 2.3 GB installed, ~45 s in all.
#   scripts/torch-venv.sh            (PYTHON=python3 by default: the interpreter the venv is made from)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${C4_TORCH_VENV:-.venv-torch}
PYTHON=${PYTHON:-python3}
TORCH=2.15.0
NCCL=2.30.7  # what torch 2.15.0 requires (nvidia-nccl-cu13)
imports() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$TORCH" <<'EOF' 2>/dev/null
import sys, torch, torch.distributed as dist
assert torch.__version__.split("+")[0] == sys.argv[1] and dist.is_available() and dist.is_gloo_available()
EOF
}
# mpi4py (c4comm_torch.comm_from_mpi, tests/torch/test_interop.py): Debian's python3-mpi4py (with
# Debian's Open MPI, which mpirun starts), linked into the environment (same CPython 3.11 ABI) rather
# than built from PyPI's source.
link_mpi4py() {
  local deb=/usr/lib/python3/dist-packages/mpi4py site
  [ -d "$deb" ] || return 0
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  [ -e "$site/mpi4py" ] || ln -s "$deb" "$site/mpi4py"
  "$VENV/bin/python" -c "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI" 2>/dev/null && return 0
  rm -f "$site/mpi4py"
  echo "[torch-venv] Debian's mpi4py does not import in $VENV: the MPI test is skipped there"
}
if imports; then
  echo "[torch-venv] $VENV has torch $TORCH"
  link_mpi4py
  exit 0
fi
t0=$(date +%s)
echo "[torch-venv] making $VENV with torch $TORCH from PyPI ($PYTHON)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check --no-warn-conflicts)
"${PIP[@]}" --no-deps "torch==$TORCH" "nvidia-nccl-cu13==$NCCL" "nvidia-cusparselt-cu13==0.8.1" \
  "nvidia-nvshmem-cu13==3.7.2" "nvidia-cufile==1.17.1.22.*"
"${PIP[@]}" filelock "typing-extensions>=4.13.0" "setuptools>=77.0.3" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 \
  "fsspec>=0.8.5" numpy pytest
if ! imports; then
  echo "[torch-venv] torch does not import without its CUDA libraries here: installing all of its dependencies"
  "${PIP[@]}" "torch==$TORCH"
  imports || { echo "[torch-venv] FAIL: torch $TORCH does not import in $VENV" >&2; exit 1; }
fi
link_mpi4py
echo "[torch-venv] $VENV ready: torch $TORCH, $(du -sh "$VENV" | cut -f1), $(($(date +%s) - t0)) s"
