"""torch.distributed backend "c4" over c4comm.

    import c4comm_torch                      # registers the backend
    torch.distributed.init_process_group("c4", rank=rank, world_size=world_size, ...)

CPU tensors only for now (CUDA tensors raise a clear error). Timeouts: c4comm fails a call after
C4_TIMEOUT seconds without progress, naming the rank it waited for. When C4_TIMEOUT is not set in
the environment, each process group sets it from its own ``timeout`` (init_process_group /
new_group argument) before creating its communicator, so torch's timeout is the one that applies.
"""

import datetime
import math
import os

import torch.distributed as _dist

from . import _C

__all__ = ["BACKEND_NAME", "c4_version", "is_registered"]

BACKEND_NAME = "c4"
c4_version = _C.c4_version

# Whether the user chose C4_TIMEOUT; if not, every process group applies its own timeout.
_USER_TIMEOUT = "C4_TIMEOUT" in os.environ

# c4comm runs each process group's calls on a worker thread beside the training threads, so a rank
# spinning while it waits takes CPU from compute. c4comm's default spin (250 us, sized for ranks that
# have their cores to themselves) cost DDP 7% of its step on 2 ranks x 2 cores (bench/torch); 30 us
# gave the best step time. The user's setting wins.
os.environ.setdefault("C4_SHM_SPIN", "30")


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _create(store, rank, world_size, timeout):
    """torch.distributed's creator function for backend "c4" (one call per process group)."""
    seconds = _seconds(timeout)
    if not _USER_TIMEOUT:
        os.environ["C4_TIMEOUT"] = str(max(1, math.ceil(seconds)))
    return _C._create(store, rank, world_size, seconds)


def is_registered():
    return hasattr(_dist.Backend, BACKEND_NAME.upper())


def _register():
    if is_registered():
        return
    register = _dist.Backend.register_backend
    try:  # torch >= 2.0: one Backend per device type, wrapped by torch in a ProcessGroup
        import inspect

        if "devices" in inspect.signature(register).parameters:
            register(BACKEND_NAME, _create, devices=["cpu", "cuda"])
            return
    except (TypeError, ValueError):
        pass
    register(BACKEND_NAME, _create)


_register()
