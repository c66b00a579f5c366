"""One communicator shared by backend c4 and the NCCL API (c4comm's libnccl.so.2, through ctypes),
both ways, and groups built from an mpi4py communicator under mpirun.
"""

import os
import shutil
import subprocess
import sys

import pytest

from harness import _BUILD_PYTHON, run_ranks

NCCL_FLOAT32 = 7
NCCL_SUM = 0


def _unique_id_type():
    import ctypes

    class UniqueId(ctypes.Structure):  # ncclUniqueId, passed by value to ncclCommInitRank
        _fields_ = [("internal", ctypes.c_char * 128)]

    return UniqueId


def nccl(lib_path):
    import ctypes

    lib = ctypes.CDLL(lib_path)
    lib.UniqueId = _unique_id_type()
    for name in ("ncclCommCount", "ncclCommUserRank"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, lib.UniqueId, ctypes.c_int]
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(lib.UniqueId)]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    return lib


def nccl_allreduce(lib, comm, t):
    """ncclAllReduce (float32 sum, in place) of tensor t on comm; returns the result code."""
    return lib.ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), NCCL_FLOAT32, NCCL_SUM, comm, None)


def rank_and_count(lib, comm):
    import ctypes

    r, n = ctypes.c_int(-1), ctypes.c_int(-1)
    lib.ncclCommUserRank(comm, ctypes.byref(r))
    lib.ncclCommCount(comm, ctypes.byref(n))
    return r.value, n.value


def _shared(ctx):
    import ctypes

    import torch
    import torch.distributed as dist

    import c4comm_torch
    from c4comm_torch import _C

    failures = []
    lib = nccl(c4comm_torch.nccl_library())
    n = ctx.world_size
    want = float(n * (n + 1) // 2)
    # 1. The group's communicator lent to the NCCL API between the group's own operations.
    x = torch.full((1000,), float(ctx.rank + 1))
    before = dist.all_reduce(x, group=ctx.c4, async_op=True)
    with c4comm_torch.nccl_comm(ctx.c4) as comm:
        if not before.is_completed():
            failures.append("nccl_comm lent the communicator before the group's issued all_reduce ran")
        if rank_and_count(lib, comm) != (ctx.rank, n):
            failures.append("ncclCommUserRank/Count: %r" % (rank_and_count(lib, comm),))
        y = torch.full((5,), float(ctx.rank + 1))
        rc = nccl_allreduce(lib, comm, y)
        if rc != 0 or not torch.equal(y, torch.full((5,), want)):
            failures.append("ncclAllReduce on the group's communicator: rc %d, %s" % (rc, y.tolist()))
        later = dist.all_reduce(x, group=ctx.c4, async_op=True)  # queued: runs after the block
    later.wait()
    if not torch.equal(x, torch.full((1000,), want * n)):
        failures.append("the group's all_reduces around the NCCL call gave %g" % x[0].item())
    backend = c4comm_torch._backend(ctx.c4)
    if _C._comm_ptr(backend) != comm:
        failures.append("_comm_ptr differs from what nccl_comm lent")
    if hasattr(backend, "_comm_ptr") and backend._comm_ptr() != comm:  # torch 2.x: ProcessGroupNCCL's name
        failures.append("backend._comm_ptr() differs")
    # 2. A communicator made through the NCCL API, adopted by a new group, still usable after it.
    uid = lib.UniqueId()
    if ctx.rank == 0:
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    box = [bytes(uid)]
    dist.broadcast_object_list(box, src=0, group=ctx.gloo)
    mine = ctypes.c_void_p()
    rc = lib.ncclCommInitRank(ctypes.byref(mine), n, lib.UniqueId.from_buffer_copy(box[0]), ctx.rank)
    if rc != 0:
        return failures + ["ncclCommInitRank: %d" % rc]
    with c4comm_torch.adopt_comm(mine.value):
        g = dist.new_group(backend="c4")
    z = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(z, group=g)
    if not torch.equal(z, torch.full((3,), want)):
        failures.append("all_reduce on the adopted communicator gave %s" % z.tolist())
    if _C._comm_ptr(c4comm_torch._backend(g)) != mine.value:
        failures.append("the new group does not run on the adopted communicator")
    dist.destroy_process_group(g)
    del g
    import gc

    gc.collect()
    z.fill_(float(ctx.rank + 1))
    rc = nccl_allreduce(lib, mine, z)  # not owned: alive after its group
    if rc != 0 or not torch.equal(z, torch.full((3,), want)):
        failures.append("ncclAllReduce after the adopting group ended: rc %d, %s" % (rc, z.tolist()))
    if lib.ncclCommDestroy(mine) != 0:
        failures.append("ncclCommDestroy failed")
    # 3. A wrong communicator for the group is refused with the reason.
    if n > 1:
        single = ctypes.c_void_p()
        one = lib.UniqueId()
        assert lib.ncclGetUniqueId(ctypes.byref(one)) == 0
        assert lib.ncclCommInitRank(ctypes.byref(single), 1, one, 0) == 0
        try:
            with c4comm_torch.adopt_comm(single.value):
                dist.new_group(backend="c4")
            failures.append("a 1-rank communicator was adopted by a %d-rank group" % n)
        except Exception as e:  # noqa: BLE001  torch wraps the creator's error
            if "rank 0 of 1" not in str(e):
                failures.append("adopting a 1-rank communicator: %s" % e)
        lib.ncclCommDestroy(single)
    return failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_communicator_shared_with_the_nccl_api(world_size):
    run_ranks(_shared, world_size)


_MPI_PROGRAM = r"""
import ctypes, datetime, sys
import torch, torch.distributed as dist
from mpi4py import MPI
import c4comm_torch
sys.path.insert(0, sys.argv[1])
from test_interop import nccl, nccl_allreduce, rank_and_count

world = MPI.COMM_WORLD
rank, n = world.Get_rank(), world.Get_size()
want = float(n * (n + 1) // 2)
lib = nccl(c4comm_torch.nccl_library())
# A communicator from an MPI.Comm, used through the NCCL API.
comm = c4comm_torch.comm_from_mpi(world)
assert rank_and_count(lib, comm) == (rank, n), rank_and_count(lib, comm)
t = torch.full((100,), float(rank + 1))
assert nccl_allreduce(lib, comm, t) == 0 and torch.equal(t, torch.full((100,), want)), t[:3]
assert lib.ncclCommDestroy(comm) == 0
# Over a split MPI communicator: ranks of the sub-communicator.
half = world.Split(rank % 2, rank)
sub = c4comm_torch.comm_from_mpi(half)
assert rank_and_count(lib, sub) == (half.Get_rank(), half.Get_size())
lib.ncclCommDestroy(sub)
# The default torch group over MPI.
c4comm_torch.init_process_group_from_mpi(timeout=datetime.timedelta(seconds=60))
x = torch.full((7,), float(rank + 1))
dist.all_reduce(x)
assert torch.equal(x, torch.full((7,), want)), x
y = torch.zeros(n)
dist.all_gather_into_tensor(y, torch.tensor([float(rank)]))
assert torch.equal(y, torch.arange(n, dtype=torch.float32)), y
dist.barrier()
dist.destroy_process_group()
print("MPI-OK rank", rank, flush=True)
"""


def test_groups_from_an_mpi_communicator(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed for %s (apt install python3-mpi4py)" % sys.executable)
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun not found (apt install openmpi-bin)")
    prog = tmp_path / "mpi_prog.py"
    prog.write_text(_MPI_PROGRAM)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(_BUILD_PYTHON), here]))
    cmd = [mpirun, "-np", "3", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(prog), here]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-6000:]
    assert out.stdout.count("MPI-OK rank") == 3, out.stdout[-6000:]
