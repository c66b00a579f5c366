"""The GPU checks of backend c4 (tests/torch/gpu/c4_cuda_collectives.py, which scripts/gpu-check.sh
runs on CUDA tensors) run here on CPU tensors: the same collectives, dtypes, Future and
point-to-point checks, so the script itself and the backend's common path are tested in CI where no
GPU is."""

import os
import subprocess
import sys

from harness import _BUILD_PYTHON

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu", "c4_cuda_collectives.py")


def test_cuda_collective_checks_pass_on_cpu_tensors():
    env = dict(os.environ, PYTHONPATH=os.path.abspath(_BUILD_PYTHON))
    r = subprocess.run([sys.executable, _SCRIPT, "--world", "3", "--device", "cpu", "--port", "29571"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all checks passed" in r.stdout
