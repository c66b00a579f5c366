"""The torch 2.x Backend API beyond the collectives (skipped on torch 1.x): split_group with
ncclCommSplit semantics, new_group on a group bound to a device, barrier with device ids,
monitored_barrier, abort and shutdown, and a rank killed during FSDP2's all-gather.
"""

from harness import run_ranks, torch2_only

pytestmark = torch2_only("Backend split/abort/shutdown/monitoredBarrier")


def _sum_of_ranks(group_ranks):
    return float(sum(r + 1 for r in group_ranks))


def _check_allreduce(dist, torch, group, global_ranks, rank, failures, what):
    x = torch.full((7,), float(rank + 1))
    dist.all_reduce(x, group=group)
    want = _sum_of_ranks(global_ranks)
    if not torch.equal(x, torch.full((7,), want)):
        failures.append("%s: all_reduce gave %s, want %g" % (what, x.tolist(), want))


def _split(ctx):
    import torch
    import torch.distributed as dist

    failures = []
    cpu = torch.device("cpu")
    parent = dist.group.WORLD
    if type(parent._get_backend(cpu)).__name__ != "ProcessGroupC4":
        failures.append("the backend object is a %s" % type(parent._get_backend(cpu)).__name__)
    # Two groups, {0, 1} and {2}: every rank is in one.
    sub = dist.split_group(parent, [[0, 1], [2]])
    mine = [0, 1] if ctx.rank < 2 else [2]
    if sub is None or dist.get_process_group_ranks(sub) != mine:
        return failures + ["split [[0,1],[2]]: rank %d got %r" % (ctx.rank, sub)]
    if sub.size() != len(mine) or sub.rank() != mine.index(ctx.rank):
        failures.append("split: rank %d is %d of %d" % (ctx.rank, sub.rank(), sub.size()))
    _check_allreduce(dist, torch, sub, mine, ctx.rank, failures, "split %s" % mine)
    if ctx.rank < 2:  # point-to-point inside the child (group ranks)
        t = torch.full((3,), float(ctx.rank))
        if ctx.rank == 0:
            dist.send(t, group_dst=1, group=sub)
        else:
            dist.recv(t, group_src=0, group=sub)
            if not torch.equal(t, torch.zeros(3)):
                failures.append("send/recv in the split group gave %s" % t.tolist())
    # Only {0, 2}: rank 1 is no member.
    pair = dist.split_group(parent, [[0, 2]])
    if ctx.rank == 1:
        if pair is not None and pair != dist.GroupMember.NON_GROUP_MEMBER:
            failures.append("rank 1 is in split [[0,2]]: %r" % pair)
    else:
        _check_allreduce(dist, torch, pair, [0, 2], ctx.rank, failures, "split [0, 2]")
    # The parent still works, after and between its children.
    _check_allreduce(dist, torch, parent, [0, 1, 2], ctx.rank, failures, "parent after splits")
    return failures


def test_split_group_has_nccl_split_semantics():
    run_ranks(_split, 3, with_gloo=False)


def _bound_device(ctx):
    import torch
    import torch.distributed as dist

    failures = []
    if dist.group.WORLD.bound_device_id != torch.device("cpu", 0):
        failures.append("bound_device_id is %r" % dist.group.WORLD.bound_device_id)
    # With a bound device and a backend that supports splitting, torch has non-members call the
    # backend's perform_nocolor_split; members create their group as usual.
    sub = dist.new_group([0, 1])
    if ctx.rank < 2:
        _check_allreduce(dist, torch, sub, [0, 1], ctx.rank, failures, "new_group [0, 1]")
    dist.barrier(device_ids=[0])
    dist.barrier()
    _check_allreduce(dist, torch, dist.group.WORLD, [0, 1, 2], ctx.rank, failures, "world")
    return failures


def test_new_group_and_barrier_with_a_bound_device():
    import torch

    run_ranks(_bound_device, 3, with_gloo=False, init_kwargs={"device_id": torch.device("cpu", 0)})


def _monitored(ctx):
    import datetime
    import time

    import torch.distributed as dist

    failures = []
    short = datetime.timedelta(seconds=2)

    def expect_raise(fn, needles, what):
        start = time.monotonic()
        try:
            fn()
        except RuntimeError as e:
            for n in needles:
                if n not in str(e):
                    failures.append("%s: %r lacks %r" % (what, str(e), n))
            if time.monotonic() - start > 15:
                failures.append("%s: raised only after %.1f s" % (what, time.monotonic() - start))
            return
        failures.append("%s: did not raise" % what)

    # Everyone comes: passes, twice.
    dist.monitored_barrier(ctx.c4, timeout=short)
    dist.monitored_barrier(ctx.c4, timeout=short, wait_all_ranks=True)
    # Rank 1 stays away: rank 0 names it, rank 2 (which came) hears nothing back.
    if ctx.rank == 0:
        expect_raise(lambda: dist.monitored_barrier(ctx.c4, timeout=short),
                     ["Rank 1 failed to pass monitoredBarrier in 2000 ms"], "rank 1 absent")
    elif ctx.rank == 2:
        expect_raise(lambda: dist.monitored_barrier(ctx.c4, timeout=short),
                     ["rank 2 reached the barrier but had no answer from rank 0"], "rank 2 without answer")
    # Ranks 1 and 2 stay away, on a fresh group; wait_all_ranks names both.
    dist.barrier(group=ctx.gloo)
    fresh = dist.new_group(backend="c4", timeout=datetime.timedelta(seconds=5))
    dist.barrier(group=fresh)
    if ctx.rank == 0:
        expect_raise(lambda: dist.monitored_barrier(fresh, timeout=short, wait_all_ranks=True),
                     ["Ranks 1, 2 failed to pass monitoredBarrier in 2000 ms"], "ranks 1, 2 absent")
    dist.barrier(group=ctx.gloo)
    return failures


def test_monitored_barrier_names_absent_ranks():
    # pg_timeout 5 s: the receives left pending by the failed barriers end within it at teardown.
    run_ranks(_monitored, 3, pg_timeout=5, timeout=120)


def _abort_and_shutdown(ctx):
    import datetime
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _abort_process_group

    failures = []
    cpu = torch.device("cpu")
    # The Work API of 2.x: sequence numbers, duration, timeout, a result code instead of raising.
    works = [dist.all_reduce(torch.ones(1000), group=ctx.c4, async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    seqs = [w._get_sequence_number() for w in works]
    if seqs != list(range(seqs[0], seqs[0] + 3)):
        failures.append("sequence numbers %s" % seqs)
    if not all(w._get_duration() > 0 for w in works):
        failures.append("durations %s" % [w._get_duration() for w in works])
    if works[0].timeout != datetime.timedelta(seconds=60):
        failures.append("timeout %s" % works[0].timeout)
    if works[0].get_future_result().wait() != 0:
        failures.append("result code of a success: %s" % works[0].get_future_result().wait())
    # Abort: rank 0's all_reduce, which rank 1 never joins, fails at once, and so does what follows.
    group = dist.new_group(backend="c4")
    dist.barrier(group=group)
    if ctx.rank == 0:
        work = dist.all_reduce(torch.ones(10), group=group, async_op=True)
        time.sleep(0.3)
        start = time.monotonic()
        _abort_process_group(group)
        try:
            work.wait()
            failures.append("the pending all_reduce succeeded after abort")
        except RuntimeError as e:
            if "aborted" not in str(e):
                failures.append("pending all_reduce after abort: %s" % e)
        if work.get_future_result().wait() != 2:  # WorkResult.COMM_ERROR
            failures.append("result code after abort: %s" % work.get_future_result().wait())
        if time.monotonic() - start > 10:
            failures.append("abort took %.1f s" % (time.monotonic() - start))
    dist.barrier(group=ctx.gloo)
    if ctx.rank == 1:
        _abort_process_group(group)
    # Shutdown (destroy_process_group): issued work runs, then the communicators are freed; the
    # backend object, still referenced, refuses work.
    group = dist.new_group(backend="c4")
    backend = group._get_backend(cpu)
    x = torch.full((4,), float(ctx.rank + 1))
    work = dist.all_reduce(x, group=group, async_op=True)
    dist.destroy_process_group(group)
    work.wait()
    if not torch.equal(x, torch.full((4,), 3.0)):
        failures.append("all_reduce issued before shutdown gave %s" % x.tolist())
    try:
        backend.allreduce([torch.ones(2)]).wait()
        failures.append("an all_reduce after shutdown succeeded")
    except RuntimeError as e:
        if "shut down" not in str(e):
            failures.append("all_reduce after shutdown: %s" % e)
    try:
        backend.send([torch.ones(2)], 1 - ctx.rank, 0)
        failures.append("a send after shutdown was accepted")
    except RuntimeError as e:
        if "shut down" not in str(e):
            failures.append("send after shutdown: %s" % e)
    return failures


def test_abort_and_shutdown():
    run_ranks(_abort_and_shutdown, 2)


def _fsdp2_killed(ctx):
    import os
    import signal
    import time

    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from test_torch2 import _transformer

    mesh = DeviceMesh.from_group(ctx.c4, "cpu")
    model = _transformer(torch)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    step = [0]

    def die(_module, _args):
        # Rank 2 dies inside FSDP2's pre-forward of layer 1: the others are in (or enter) its
        # all-gather of that layer's parameters.
        if ctx.rank == 2 and step[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    model[1].register_forward_pre_hook(die)
    start = time.monotonic()
    try:
        for step[0] in range(20):
            model(torch.randn(4, 6, 32)).pow(2).mean().backward()
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - start}
    return {"error": None}


def test_rank_killed_during_fsdp2_all_gather():
    res = run_ranks(_fsdp2_killed, 3, timeout=200, expect_dead=(2,))
    for r in (0, 1):
        err = res[r]["error"]
        assert err is not None, "rank %d finished training with rank 2 dead" % r
        assert "rank 2" in err, "rank %d's error does not name rank 2: %s" % (r, err)
        assert res[r]["seconds"] < 60, "rank %d raised only after %.1f s" % (r, res[r]["seconds"])
