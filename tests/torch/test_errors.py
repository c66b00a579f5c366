"""Failures surface as Python exceptions carrying c4comm's reason, and never hang."""

import pytest

from harness import run_ranks


def _killed_peer(ctx):
    import os
    import signal
    import time

    import torch
    import torch.distributed as dist

    x = torch.ones(50000)
    start = time.monotonic()
    try:
        for i in range(1000000):
            if ctx.rank == 2 and i == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(x)
            x.fill_(1.0)
    except RuntimeError as e:
        import c4comm_torch

        return {"error": str(e), "seconds": time.monotonic() - start, "diagnoses": c4comm_torch.diagnoses()}
    return {"error": None}


def test_killed_rank_makes_the_others_raise():
    # C4_TIMEOUT bounds the wait if the death were not noticed directly; the harness's 120 s
    # timeout turns a hang into a failure.
    res = run_ranks(_killed_peer, 3, timeout=120, env={"C4_TIMEOUT": "10"}, with_gloo=False, pg_timeout=10,
                    expect_dead=(2,))
    for r in (0, 1):
        err = res[r]["error"]
        assert err is not None, "rank %d finished its loop without an error" % r
        assert "c4 allreduce" in err, err
        assert "rank 2" in err, "the error does not name the dead rank: " + err
        # C4D's diagnosis rides in the exception, and c4comm_torch.diagnoses() has the record.
        assert "[C4D dead_rank" in err, err
        dead = [d for d in res[r]["diagnoses"] if d["class"] == "dead_rank"]
        assert dead and dead[0]["culprit"]["ranks"] == [2], res[r]["diagnoses"]


def _silent_peer(ctx):
    import datetime
    import time

    import torch
    import torch.distributed as dist

    out = {}
    if ctx.rank == 0:
        x = torch.ones(4)
        work = dist.all_reduce(x, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(milliseconds=200))
            out["wait"] = None
        except RuntimeError as e:
            out["wait"] = str(e)
        try:
            work.wait()
            out["op"] = None
        except RuntimeError as e:
            out["op"] = str(e)
        try:  # the communicator has failed: later calls fail at once with the same reason
            dist.all_reduce(torch.ones(1))
            out["later"] = None
        except RuntimeError as e:
            out["later"] = str(e)
    else:
        time.sleep(6)  # never joins the allreduce; a 2 s timeout makes rank 0 give up first
    return out


# The group's timeout applies to its communicator; C4_TIMEOUT, when set, overrides it.
@pytest.mark.parametrize("env,pg_timeout", [({}, 2), ({"C4_TIMEOUT": "2"}, 60)], ids=["group-timeout", "env-wins"])
def test_silent_rank_times_out_with_its_name(env, pg_timeout):
    res = run_ranks(_silent_peer, 2, timeout=120, env=env, with_gloo=False, pg_timeout=pg_timeout)
    r0 = res[0]
    assert r0["wait"] is not None and "timed out" in r0["wait"], r0
    assert r0["op"] is not None and "rank 1" in r0["op"] and "no progress for 2000 ms" in r0["op"], r0
    assert r0["later"] is not None, r0


def _nobody_sends(ctx):
    import time

    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        time.sleep(5)  # alive, sends nothing
        return {}
    start = time.monotonic()
    try:
        dist.recv(torch.ones(2))
        return {"error": None}
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - start}


def test_recv_from_any_source_times_out():
    res = run_ranks(_nobody_sends, 2, timeout=60, with_gloo=False, pg_timeout=2)
    r0 = res[0]
    assert r0["error"] is not None and "no message from any rank within 2000 ms" in r0["error"], r0
    assert 1.5 < r0["seconds"] < 10, r0


def _bad_arguments(ctx):
    import torch
    import torch.distributed as dist

    errors = {}

    def expect(name, fn, needle):
        try:
            fn()
            errors[name] = "no error"
        except (RuntimeError, ValueError) as e:
            if needle not in str(e):
                errors[name] = "message without %r: %s" % (needle, e)

    expect("int16 dtype", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), "not supported")
    expect("BAND", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND), "bitwise")
    expect("premul on ints", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                                     op=dist._make_nccl_premul_sum(2.0)), "floating-point")
    if ctx.world_size == 1:
        expect("recv from any source alone", lambda: dist.recv(torch.ones(2)), "no other rank")
    else:
        expect("recv from any source, empty", lambda: dist.recv(torch.ones(0)), "non-empty tensor")
    expect("allgather size", lambda: dist.all_gather([torch.ones(3)] * ctx.world_size, torch.ones(2)), "elements")
    expect("sparse", lambda: dist.all_reduce(torch.ones(2).to_sparse()), "dense")
    # the group still works after rejected calls
    x = torch.ones(3)
    dist.all_reduce(x)
    if not torch.equal(x, torch.full((3,), float(ctx.world_size))):
        errors["after errors"] = str(x)
    return ["%s: %s" % kv for kv in errors.items()]


@pytest.mark.parametrize("world_size", [1, 2])
def test_bad_arguments_raise_clear_errors(world_size):
    run_ranks(_bad_arguments, world_size, with_gloo=False)
