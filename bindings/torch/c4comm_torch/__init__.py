"""torch.distributed backend "c4" over c4comm.

    import c4comm_torch                      # registers the backend
    torch.distributed.init_process_group("c4", rank=rank, world_size=world_size, ...)

CPU tensors, and CUDA tensors with torch 2.2 or newer (ordered on their current streams as with
backend nccl; docs/torch-backend.md). Timeouts: c4comm fails a call that
sees no progress for the process group's ``timeout`` (init_process_group / new_group argument),
naming the rank it waited for; C4_TIMEOUT in the environment overrides it.
"""

import atexit
import contextlib
import datetime

import torch.distributed as _dist

from . import _C

__all__ = [
    "BACKEND_NAME",
    "adopt_comm",
    "c4_version",
    "comm_from_mpi",
    "diagnoses",
    "empty",
    "init_process_group_from_mpi",
    "is_registered",
    "nccl_comm",
    "nccl_library",
    "shared_allocations",
]

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


def _backend(group):
    """The c4 backend object of `group` (None: the default group)."""
    import torch

    group = group or _dist.group.WORLD
    if hasattr(group, "_get_backend"):  # torch 2.x: one backend per device type
        return group._get_backend(torch.device("cpu"))
    return group


def nccl_library():
    """The path of the ``libnccl.so.2`` built with the ``libc4comm.so`` this package uses: load it
    (``ctypes.CDLL``) to call the NCCL API on a group's communicator (`nccl_comm`)."""
    import os

    return os.path.join(_C._library_dir(), "libnccl.so.2")


@contextlib.contextmanager
def nccl_comm(group=None):
    """Lends the collective communicator of c4 group `group` to the NCCL API: yields its
    ``ncclComm_t`` (an address, for ``ctypes.c_void_p``) once every operation issued on the group
    before has run, and holds the group's worker until the block ends, so that the caller's NCCL
    calls (through `nccl_library()`) and the group's own never overlap. Operations issued on the
    group inside the block run after it: do not wait for them inside. Like ProcessGroupNCCL's
    ``_comm_ptr()``, but safe to use while the group has work in flight."""
    backend = _backend(group)
    comm = _C._pause(backend)
    try:
        yield comm
    finally:
        _C._resume(backend)


@contextlib.contextmanager
def adopt_comm(comm, owned=False):
    """Inside, the next c4 group this process creates (``init_process_group("c4", ...)`` or
    ``new_group(backend="c4")``) runs on the existing communicator `comm` (an ``ncclComm_t`` of
    c4comm's libnccl.so.2, e.g. from `comm_from_mpi` or a C/C++ library, as an int) instead of
    making its own; its rank and size must be the group's. ``owned=False``: the group leaves it
    alive when it ends (the caller destroys it, after the group); ``owned=True``: the group destroys
    it. The store given to torch still serves point-to-point operations."""
    _C._adopt_next(int(comm), bool(owned))
    try:
        yield
    finally:
        _C._adopt_next(0, False)


def comm_from_mpi(mpi_comm=None):
    """A c4comm communicator over the processes of an mpi4py communicator (default
    ``MPI.COMM_WORLD``), with the same rank numbers, as ``c4CommInitMPI`` makes one in C (README,
    "MPI"): rank 0 creates the unique id, MPI broadcasts it, and the outcome is agreed over MPI, so
    either every rank gets a communicator or every rank raises. Collective over `mpi_comm`.
    Returns its ``ncclComm_t`` as an int: use it with the NCCL API (`nccl_library()`), hand it to a
    torch group (`adopt_comm`), and destroy it with ``ncclCommDestroy`` when done (unless a group
    owns it). Any mpi4py works (MPI carries only bytes here)."""
    from mpi4py import MPI

    mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    uid, error = None, None
    if rank == 0:
        try:
            uid = _C._unique_id()
        except RuntimeError as e:
            error = e
    uid = mpi_comm.bcast(uid, root=0)
    if uid is None:
        raise error or RuntimeError("c4 comm_from_mpi: MPI rank 0 could not create the unique id (see its error)")
    comm = 0
    try:
        comm = _C._comm_init_rank(uid, size, rank)
    except RuntimeError as e:
        error = e
    if not mpi_comm.allreduce(1 if comm else 0, op=MPI.MIN):
        if comm:
            _C._comm_destroy(comm)
        raise error or RuntimeError("c4 comm_from_mpi: creating the communicator failed on another MPI rank")
    return comm


def init_process_group_from_mpi(mpi_comm=None, timeout=None):
    """``torch.distributed.init_process_group("c4")`` for a program started by mpirun: the ranks
    and the world are `mpi_comm`'s (default ``MPI.COMM_WORLD``), the c4 communicator is made over
    MPI (`comm_from_mpi`) and owned by the default group, and rank 0 hosts the group's TCPStore on
    a free port it tells the others over MPI (its host: ``MASTER_ADDR`` if set, else its host
    name). `timeout`: the group's (a timedelta; torch's default if None)."""
    import os
    import socket

    from mpi4py import MPI
    from torch.distributed import TCPStore

    mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    comm = comm_from_mpi(mpi_comm)
    store_timeout = timeout or datetime.timedelta(minutes=30)
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        store = TCPStore(host, 0, size, True, store_timeout, wait_for_workers=False)
        host, port = mpi_comm.bcast((host, store.port), root=0)
    else:
        host, port = mpi_comm.bcast(None, root=0)
        store = TCPStore(host, port, size, False, store_timeout)
    kwargs = {} if timeout is None else {"timeout": timeout}
    with adopt_comm(comm, owned=True):
        _dist.init_process_group(BACKEND_NAME, store=store, rank=rank, world_size=size, **kwargs)


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
