"""torch.distributed backend "c4" over c4comm.

    import c4comm_torch                      # registers the backend
    torch.distributed.init_process_group("c4", rank=rank, world_size=world_size, ...)

CPU tensors only for now (CUDA tensors raise a clear error). Timeouts: c4comm fails a call that
sees no progress for the process group's ``timeout`` (init_process_group / new_group argument),
naming the rank it waited for; C4_TIMEOUT in the environment overrides it.
"""

import atexit
import contextlib
import datetime

import torch.distributed as _dist

from . import _C

__all__ = ["BACKEND_NAME", "c4_version", "diagnoses", "empty", "is_registered", "shared_allocations"]

BACKEND_NAME = "c4"
c4_version = _C.c4_version
# Groups still alive at exit (FSDP2 keeps references) must not release tensors once Python
# finalizes (bindings/torch/process_group_c4.hpp, pythonExiting).
atexit.register(_C._python_exiting)


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _create(store, rank, world_size, timeout):
    """torch.distributed's creator function for backend "c4" (one call per process group)."""
    return _C._create(store, rank, world_size, _seconds(timeout))


def empty(*size, dtype=None):
    """A CPU tensor like ``torch.empty(*size, dtype=dtype)`` (zero-filled), on the shareable memory
    ``ncclMemAlloc`` returns. Backend c4 runs collectives on such tensors zero-copy when every rank
    passes one and all ranks share the host: each rank reads and writes the others' tensors in
    place (docs/shm-transport.md, "Zero-copy path"). Allocate a few large buffers (each holds a
    file descriptor) and reuse them, e.g. one flat gradient buffer."""
    import torch

    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dtype = dtype or torch.get_default_dtype()
    numel = 1
    for s in size:
        numel *= int(s)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = _C._shared_bytes(numel * itemsize)
    return raw.view(dtype).reshape(size)


@contextlib.contextmanager
def shared_allocations(min_bytes=1 << 20):
    """Inside, CPU tensors of at least ``min_bytes`` are allocated like ``c4comm_torch.empty``'s
    (shareable memory), the rest as usual. Meant for DDP: build it with
    ``gradient_as_bucket_view=True`` and run its first two steps inside (DDP rebuilds its buckets
    once, at the second step); its buckets, and so the parameters' gradients, then live in
    shareable memory and backend c4 reduces them zero-copy. Tensors keep their memory after the
    block. Not reentrant."""
    _C._set_shared_allocator(int(min_bytes))
    try:
        yield
    finally:
        _C._reset_allocator()


def diagnoses():
    """C4D's diagnoses (docs/c4d.md) made or received by this process's c4 groups, oldest first: a
    list of dicts (class, culprit ranks/hosts/links, summary, evidence, confidence, ...). When a
    collective raises because a rank died or hung, the culprit is here (and in the exception's
    text), so survivors can rebuild the group without it."""
    import json

    return [json.loads(s) for s in _C._diagnoses()]


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
