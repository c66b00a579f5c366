"""pytest setup for the c4 torch backend: finds the built package or skips with the reason."""

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

from harness import _BUILD_PYTHON  # noqa: E402

sys.path.insert(0, os.path.abspath(_BUILD_PYTHON))
# Spawned ranks inherit sys.path from this process (multiprocessing's spawn preparation data).

try:
    import torch  # noqa: F401
    import torch.distributed as dist

    _TORCH_REASON = None if dist.is_available() else "torch.distributed is not available"
except ImportError as e:  # torch absent: the whole directory is skipped
    _TORCH_REASON = "torch is not installed for %s (%s)" % (sys.executable, e)

if _TORCH_REASON is None:
    try:
        import c4comm_torch  # noqa: F401
    except ImportError as e:
        _TORCH_REASON = "c4comm_torch is not built in %s (%s)" % (_BUILD_PYTHON, e)


def pytest_collection_modifyitems(config, items):
    if _TORCH_REASON is None:
        return
    skip = pytest.mark.skip(reason=_TORCH_REASON)
    for item in items:
        item.add_marker(skip)
