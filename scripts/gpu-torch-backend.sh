#!/usr/bin/env bash
# Builds the torch.distributed backend "c4" (bindings/torch) against the torch of THIS machine's
# python3, beside a c4comm build or gpu-pack made elsewhere: a PyTorch extension must be compiled
# for the very torch that loads it, and a GPU host's CUDA torch is not the one CI builds against.
# Needs only a C++ compiler and that torch (its headers and pybind11 come with it); no CMake
# project, GoogleTest or package registry (scripts/gpu-check.sh calls it there).
#
# Usage: scripts/gpu-torch-backend.sh BUILD_OR_PACK_DIR OUT_DIR
# Then:  PYTHONPATH=OUT_DIR python3 -c "import c4comm_torch"   (libc4comm.so from BUILD/lib)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(cd "${1:?usage: $0 BUILD_OR_PACK_DIR OUT_DIR}" && pwd)
OUT=${2:?usage: $0 BUILD_OR_PACK_DIR OUT_DIR}
PY=${PYTHON:-python3}
CXX=${CXX:-g++}

# What torch's cpp_extension would use (the same query as bindings/torch/CMakeLists.txt).
eval "$("$PY" - <<'EOF'
import shlex, sysconfig, torch
from torch.utils import cpp_extension as ce
v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
print("INCLUDES=%s" % shlex.quote(" ".join("-isystem " + p for p in ce.include_paths())))
print("PYINCLUDE=%s" % shlex.quote(sysconfig.get_paths()["include"]))
print("SUFFIX=%s" % shlex.quote(sysconfig.get_config_var("EXT_SUFFIX")))
print("ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("LIBDIR=%s" % shlex.quote(ce.library_paths()[0]))
print("STD=%s" % ("c++20" if v >= (2, 12) else "c++17"))
print("VERSION=%s" % shlex.quote(torch.__version__))
names = ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")
vals = [getattr(torch._C, "_PYBIND11_" + n, None) for n in names]
defs = " ".join("-DPYBIND11_%s='\"%s\"'" % nv for nv in zip(names, vals)) if v < (2, 9) and all(vals) else ""
print("PYBIND11=%s" % shlex.quote(defs))
EOF
)"
if [ "$ABI" != 1 ]; then
  echo "gpu-torch-backend: torch $VERSION uses the old C++ string ABI; libc4comm needs the C++11 one" >&2
  exit 1
fi
LIBC4=$(ls "$BUILD"/lib/libc4comm.so* | head -n1)
PKG="$OUT/c4comm_torch"
mkdir -p "$PKG"
cp bindings/torch/c4comm_torch/__init__.py "$PKG/"
echo "[gpu-torch-backend] torch $VERSION: compiling bindings/torch into $PKG/_C$SUFFIX"
# shellcheck disable=SC2086 # the flag lists are meant to split
eval "$CXX" -std=$STD -O2 -g0 -fPIC -shared -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=1 -DTORCH_EXTENSION_NAME=_C \
  -DTORCH_API_INCLUDE_EXTENSION_H $PYBIND11 -I. -Iinclude $INCLUDES -isystem "$PYINCLUDE" \
  bindings/torch/process_group_c4.cc bindings/torch/module.cc -o "$PKG/_C$SUFFIX" \
  "$LIBC4" -L"$LIBDIR" -ltorch_python -ltorch -ltorch_cpu -lc10 \
  -Wl,-rpath,"$(dirname "$LIBC4")" -Wl,-rpath,"$LIBDIR"
echo "[gpu-torch-backend] done: PYTHONPATH=$OUT"
