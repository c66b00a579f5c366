"""Runs a function on N ranks (forked processes) for the c4 backend tests.

Every rank joins a default gloo group (the reference) and a c4 group over the same ranks, then
calls fn(ctx) where ctx has rank, world_size, c4 (the c4 group) and gloo (the default group). A
rank returns a list of failure strings (empty = passed) or raises; run_ranks() fails the test
with every rank's messages. A rank still alive after `timeout` seconds is a hang: all are killed
and the test fails.
"""

import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import time
import traceback

_BUILD_PYTHON = os.environ.get(
    "C4_TORCH_PYTHONPATH",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python"),
)


class Ctx:
    def __init__(self, rank, world_size, c4, gloo):
        self.rank = rank
        self.world_size = world_size
        self.c4 = c4
        self.gloo = gloo


def _entry(fn, rank, world_size, store_path, results, env, with_gloo, timeout_s, hang_s, init_kwargs):
    import faulthandler

    faulthandler.enable()  # a crashing rank prints its Python stack
    faulthandler.dump_traceback_later(hang_s)  # and a hanging one its threads' stacks
    status, payload = "error", ""
    try:
        os.environ.update(env)
        import datetime

        import torch
        import torch.distributed as dist

        import c4comm_torch  # noqa: F401  registers backend "c4"

        torch.set_num_threads(1)
        timeout = datetime.timedelta(seconds=timeout_s)
        init = "file://" + store_path
        if with_gloo:
            dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size, timeout=timeout,
                                    **(init_kwargs or {}))
            c4 = dist.new_group(backend="c4", timeout=timeout)
            ctx = Ctx(rank, world_size, c4, dist.group.WORLD)
        else:
            dist.init_process_group("c4", init_method=init, rank=rank, world_size=world_size, timeout=timeout,
                                    **(init_kwargs or {}))
            ctx = Ctx(rank, world_size, dist.group.WORLD, None)
        payload = fn(ctx)
        status = "ok"
        dist.destroy_process_group()
    except BaseException:  # report everything, including SystemExit from a failed assert helper
        payload = traceback.format_exc()
    results.put((rank, status, payload))


_CONTEXT = None


def _context():
    """Ranks fork from one server process that imported torch once (multiprocessing's forkserver,
    started at the first run and kept): a fresh interpreter per rank spent 1-2 s of CPU importing
    torch, several minutes of a whole suite run. The server imports nothing else, so each rank
    still loads c4comm_torch after its environment is set."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "torch.distributed"])
    return _CONTEXT


def run_ranks(fn, world_size, timeout=120, env=None, with_gloo=True, pg_timeout=60, expect_dead=(), init_kwargs=None):
    """Runs fn on world_size ranks; returns {rank: payload}. Ranks in expect_dead may vanish.
    init_kwargs: more arguments of init_process_group (e.g. device_id)."""
    ctx = _context()
    results = ctx.Queue()
    env = dict(env or {})
    tmpdir = tempfile.mkdtemp(prefix="c4torch-")
    store = os.path.join(tmpdir, "store")
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world_size, store, results, env, with_gloo, pg_timeout, max(1, timeout - 5), init_kwargs))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + timeout
    alive_expected = world_size - len(expect_dead)
    while len(got) < world_size and time.monotonic() < deadline:
        try:
            rank, status, payload = results.get(timeout=0.5)
            got[rank] = (status, payload)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
            if len(got) >= alive_expected and all(
                not procs[r].is_alive() for r in expect_dead
            ):
                break
    hung = [r for r, p in enumerate(procs) if p.is_alive() and r not in got]
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()) if not hung else 0)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    shutil.rmtree(tmpdir, ignore_errors=True)  # the file store of this run
    msgs = []
    if hung:
        msgs.append("ranks %s still running after %d s (hang)" % (hung, timeout))
    for r in range(world_size):
        if r in expect_dead:
            continue
        if r not in got:
            msgs.append("rank %d exited with code %s without a result" % (r, procs[r].exitcode))
            continue
        status, payload = got[r]
        if status != "ok":
            msgs.append("rank %d raised:\n%s" % (r, payload))
        elif isinstance(payload, list) and payload:
            msgs.append("rank %d failures:\n  %s" % (r, "\n  ".join(payload)))
    if msgs:
        raise AssertionError("\n".join(msgs))
    return {r: got[r][1] for r in got}


def torch2_only(reason):
    """A pytest mark that skips a test module or test on torch 1.x."""
    import pytest

    try:
        import torch

        torch2 = int(torch.__version__.split(".")[0]) >= 2
    except ImportError:  # the conftest skips the directory
        torch2 = False
    return pytest.mark.skipif(not torch2, reason="needs torch 2.x (%s)" % reason)
