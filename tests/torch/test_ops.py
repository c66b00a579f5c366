"""Every operation of backend c4 against gloo's results, on 1-4 ranks and several dtypes.

Inputs are small integers (exact in every dtype), so results must be equal; only AVG in
floating point, which c4comm computes as a sum of inputs scaled by 1/n, gets a tolerance of a few
units in the last place of the dtype. Where gloo lacks an operation or a dtype (bfloat16, bool,
AVG, PREMUL_SUM, reduce_scatter, list alltoall), its result is built from gloo operations it has.
"""

import pytest

from harness import run_ranks

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]
COUNTS = [0, 1, 7, 5003]  # 5003 x 4 bytes is above c4's one-shot limit: the schedule path runs


def _setup():
    import torch
    import torch.distributed as dist

    return torch, dist


def _make(torch, rank, n, dtype, salt=0, hi=5):
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + salt) % hi + 1
    if dtype == torch.bool:
        return v % 2 == 0
    return v.to(dtype)


class Checker:
    def __init__(self, ctx):
        self.torch, self.dist = _setup()
        self.ctx = ctx
        self.failures = []

    def equal(self, what, got, want, avg=False):
        torch = self.torch
        if got.dtype != want.dtype or got.shape != want.shape:
            self.failures.append("%s: got %s %s, want %s %s" % (what, got.dtype, tuple(got.shape), want.dtype,
                                                                tuple(want.shape)))
            return
        if avg and got.is_floating_point():
            tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(got.dtype, 1e-6)
            ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
        else:
            ok = torch.equal(got, want)
        if not ok:
            self.failures.append("%s: got %s want %s" % (what, got.flatten()[:8].tolist(), want.flatten()[:8].tolist()))

    def gloo(self, fn, *tensors):
        """Runs fn(*tensors) on gloo; if gloo lacks the dtype, on float64 copies cast back."""
        torch = self.torch
        try:
            clones = [t.clone() for t in tensors]
            fn(*clones)
            return clones
        except RuntimeError:
            wide = [t.double() for t in tensors]
            fn(*wide)
            return [w.to(t.dtype) if t.dtype != torch.bool else w != 0 for w, t in zip(wide, tensors)]


def _collectives(ctx):
    c = Checker(ctx)
    torch, dist = c.torch, c.dist
    R = dist.ReduceOp
    r, ws, c4, gloo = ctx.rank, ctx.world_size, ctx.c4, ctx.gloo
    for name in DTYPES:
        dt = getattr(torch, name)
        is_float = dt.is_floating_point
        for n in COUNTS:
            tag = "%s n=%d" % (name, n)
            # allreduce with every builtin op
            for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX):
                x = _make(torch, r, n, dt, hi=3 if op == R.PRODUCT else 5)
                want = c.gloo(lambda t: dist.all_reduce(t, op=op, group=gloo), x)[0]
                got = x.clone()
                dist.all_reduce(got, op=op, group=c4)
                c.equal("allreduce %s %s" % (op, tag), got, want)
            if dt != torch.bool:
                # AVG: gloo's sum / ws
                x = _make(torch, r, n, dt)
                s = x.double().clone()  # .double() of a float64 tensor is the tensor itself
                dist.all_reduce(s, group=gloo)
                want = (s / ws).to(dt) if is_float else torch.div(s, ws, rounding_mode="trunc").to(dt)
                got = x.clone()
                dist.all_reduce(got, op=R.AVG, group=c4)
                c.equal("allreduce AVG " + tag, got, want, avg=True)
            if is_float:
                # PREMUL_SUM with a number and with a one-element tensor factor (0.5: exact); torch 1.x
                # takes the tensor in a list, 2.x alone.
                t_factor = torch.tensor([0.5], dtype=dt)
                for factor in (0.5, [t_factor] if torch.__version__.startswith("1.") else t_factor):
                    x = _make(torch, r, n, dt)
                    s = x.double() * 0.5
                    dist.all_reduce(s, group=gloo)
                    got = x.clone()
                    dist.all_reduce(got, op=dist._make_nccl_premul_sum(factor), group=c4)
                    c.equal("allreduce PREMUL_SUM(%s) %s" % (type(factor).__name__, tag), got, s.to(dt))
            # broadcast and reduce from every root
            for root in range(ws):
                x = _make(torch, r, n, dt, salt=root)
                want = c.gloo(lambda t: dist.broadcast(t, root, group=gloo), x)[0]
                got = x.clone()
                dist.broadcast(got, root, group=c4)
                c.equal("broadcast root %d %s" % (root, tag), got, want)
                for op in (R.SUM, R.MAX):
                    want = c.gloo(lambda t: dist.reduce(t, root, op=op, group=gloo), x)[0]
                    got = x.clone()
                    dist.reduce(got, root, op=op, group=c4)
                    if r == root:
                        c.equal("reduce %s root %d %s" % (op, root, tag), got, want)
            # allgather (list and flat), gather, scatter
            x = _make(torch, r, n, dt)
            want = [torch.empty_like(x) for _ in range(ws)]
            try:
                if n > 0:  # gloo's all_gather dies of SIGFPE on empty tensors (torch 1.13)
                    dist.all_gather(want, x, group=gloo)
            except RuntimeError:
                wide = [torch.empty(n, dtype=torch.float64) for _ in range(ws)]
                dist.all_gather(wide, x.double(), group=gloo)
                want = [w.to(dt) if dt != torch.bool else w != 0 for w in wide]
            got = [torch.empty_like(x) for _ in range(ws)]
            dist.all_gather(got, x, group=c4)
            for i in range(ws):
                c.equal("allgather[%d] %s" % (i, tag), got[i], want[i])
            flat = torch.empty(ws * n, dtype=dt)
            dist._all_gather_base(flat, x, group=c4)
            c.equal("_allgather_base " + tag, flat, torch.cat(want))
            for root in range(ws):
                got = [torch.empty_like(x) for _ in range(ws)] if r == root else None
                dist.gather(x, got, dst=root, group=c4)
                if r == root:
                    for i in range(ws):
                        c.equal("gather root %d [%d] %s" % (root, i, tag), got[i], want[i])
                chunks = [_make(torch, i, n, dt, salt=root) for i in range(ws)] if r == root else None
                got = torch.empty(n, dtype=dt)
                dist.scatter(got, chunks, src=root, group=c4)
                ref = torch.empty(n, dtype=torch.float64)  # gloo's scatter lacks bfloat16 and bool
                if n > 0:
                    dist.scatter(ref, [t.double() for t in chunks] if r == root else None, src=root, group=gloo)
                c.equal("scatter root %d %s" % (root, tag), got, ref.to(dt) if dt != torch.bool else ref != 0)
            # reduce_scatter (list and flat): gloo's allreduce of everything, this rank's slice
            for op in (R.SUM, R.MIN):
                ins = [_make(torch, r, n, dt, salt=i) for i in range(ws)]
                full = c.gloo(lambda t: dist.all_reduce(t, op=op, group=gloo), torch.cat(ins))[0]
                want = full[r * n:(r + 1) * n]
                got = torch.empty(n, dtype=dt)
                dist.reduce_scatter(got, ins, op=op, group=c4)
                c.equal("reduce_scatter %s %s" % (op, tag), got, want)
                got = torch.empty(n, dtype=dt)
                dist._reduce_scatter_base(got, torch.cat(ins), op=op, group=c4)
                c.equal("_reduce_scatter_base %s %s" % (op, tag), got, want)
        # allreduce_coalesced and allgather_coalesced over tensors of several sizes
        xs = [_make(torch, r, k, dt, salt=k) for k in (3, 0, 129)]
        want = [c.gloo(lambda t: dist.all_reduce(t, group=gloo), x)[0] for x in xs]
        got = [x.clone() for x in xs]
        dist.all_reduce_coalesced(got, group=c4)
        for i in range(len(xs)):
            c.equal("allreduce_coalesced[%d] %s" % (i, name), got[i], want[i])
        outs = [[torch.empty_like(x) for x in xs] for _ in range(ws)]
        dist.all_gather_coalesced(outs, xs, group=c4)
        for q in range(ws):
            for i, x in enumerate(xs):
                c.equal("allgather_coalesced[%d][%d] %s" % (q, i, name), outs[q][i], _make(torch, q, x.numel(), dt,
                                                                                              salt=x.numel()))
    # non-contiguous tensors are reduced in place (through a contiguous copy)
    base = _make(torch, r, 24, torch.float32).view(4, 6)
    view = base[:, ::2]
    want = view.clone()
    dist.all_reduce(want, group=gloo)
    keep = base[:, 1::2].clone()
    dist.all_reduce(view, group=c4)
    c.equal("allreduce non-contiguous", base[:, ::2], want)
    c.equal("allreduce non-contiguous: other columns untouched", base[:, 1::2], keep)
    # async work: getFuture() carries the output tensor; then() chains
    x = torch.full((5,), float(r + 1))
    fut = dist.all_reduce(x, group=c4, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    total = float(sum(range(1, ws + 1)))
    c.equal("future.then", fut.wait(), torch.full((5,), 2 * total))
    dist.barrier(group=c4)
    return c.failures


def _alltoall_p2p(ctx):
    c = Checker(ctx)
    torch, dist = c.torch, c.dist
    r, ws, c4, gloo = ctx.rank, ctx.world_size, ctx.c4, ctx.gloo
    for name in ("float32", "float64", "bfloat16", "int64", "uint8"):
        dt = getattr(torch, name)
        for rows in (0, 1, 5):
            # even alltoall_base: rows per peer, 3 columns
            x = _make(torch, r, ws * rows * 3, dt).view(ws * rows, 3)
            want = c.gloo(lambda o, i: dist.all_to_all_single(o, i, group=gloo), torch.empty_like(x), x)[0]
            got = torch.empty_like(x)
            dist.all_to_all_single(got, x, group=c4)
            c.equal("alltoall_base even rows=%d %s" % (rows, name), got, want)
            # uneven: rank r sends (r + p + rows) % 3 rows to peer p
            send = [(r + p + rows) % 3 for p in range(ws)]
            recv = [(p + r + rows) % 3 for p in range(ws)]
            x = _make(torch, r, sum(send) * 2, dt).view(sum(send), 2)
            want = c.gloo(lambda o, i: dist.all_to_all_single(o, i, recv, send, group=gloo),
                          torch.empty(sum(recv), 2, dtype=dt), x)[0]
            got = torch.empty(sum(recv), 2, dtype=dt)
            dist.all_to_all_single(got, x, recv, send, group=c4)
            c.equal("alltoall_base uneven rows=%d %s" % (rows, name), got, want)
            # list alltoall with a different size per peer
            ins = [_make(torch, r, (r + p + rows) % 4, dt, salt=p) for p in range(ws)]
            outs = [torch.empty((p + r + rows) % 4, dtype=dt) for p in range(ws)]
            dist.all_to_all(outs, ins, group=c4)
            flat_want = c.gloo(lambda o, i: dist.all_to_all_single(o, i, [t.numel() for t in outs],
                                                                    [t.numel() for t in ins], group=gloo),
                               torch.empty(sum(t.numel() for t in outs), dtype=dt), torch.cat(ins))[0]
            c.equal("alltoall list rows=%d %s" % (rows, name), torch.cat(outs), flat_want)
        # send/recv in a ring, blocking; then an isend/irecv exchange in both directions at once
        if ws > 1:
            nxt, prv = (r + 1) % ws, (r - 1) % ws
            for n in (1, 100003):
                x = _make(torch, r, n, dt)
                got = torch.empty(n, dtype=dt)
                if r % 2 == 0:
                    dist.send(x, nxt, group=c4)
                    dist.recv(got, prv, group=c4)
                else:
                    dist.recv(got, prv, group=c4)
                    dist.send(x, nxt, group=c4)
                c.equal("send/recv ring n=%d %s" % (n, name), got, _make(torch, prv, n, dt))
                got = torch.empty(n, dtype=dt)
                reqs = [dist.isend(x, nxt, group=c4), dist.irecv(got, prv, group=c4)]
                for q in reqs:
                    q.wait()
                c.equal("isend/irecv ring n=%d %s" % (n, name), got, _make(torch, prv, n, dt))
                # both directions with the same peer, sends issued first on both sides
                got_n, got_p = torch.empty(n, dtype=dt), torch.empty(n, dtype=dt)
                reqs = [dist.isend(x, nxt, group=c4), dist.isend(x, prv, group=c4),
                        dist.irecv(got_p, prv, group=c4), dist.irecv(got_n, nxt, group=c4)]
                for q in reqs:
                    q.wait()
                c.equal("isend/irecv both ways (from prev) n=%d %s" % (n, name), got_p, _make(torch, prv, n, dt))
                c.equal("isend/irecv both ways (from next) n=%d %s" % (n, name), got_n, _make(torch, nxt, n, dt))
    dist.barrier(group=c4)
    return c.failures


def _any_source(ctx):
    c = Checker(ctx)
    torch, dist = c.torch, c.dist
    r, ws, c4 = ctx.rank, ctx.world_size, ctx.c4
    # Every rank in turn receives two messages from each other rank by any source, alternating
    # recv and irecv (PyTorch's test_send_recv_any_source, with a small and a large size and a
    # non-contiguous receive tensor). The first round finds no receive channel yet.
    for n in (1, 100003):
        for dst in range(ws):
            if dst != r:
                for k in range(2):
                    dist.send(torch.full((n,), float(r * 10 + k)), dst, group=c4)
                continue
            got_from = {}
            for i in range(2 * (ws - 1)):
                out = torch.full((n, 2), -1.0)[:, 0] if i % 2 else torch.full((n,), -1.0)
                if i % 2 == 0:
                    sender = dist.recv(out, group=c4)
                else:
                    work = dist.irecv(out, group=c4)
                    work.wait()
                    sender = work._source_rank()
                k = got_from.get(sender, 0)
                got_from[sender] = k + 1
                c.equal("any source n=%d message %d from %d" % (n, k, sender), out,
                        torch.full((n,), float(sender * 10 + k)))
            if sorted(got_from.items()) != [(p, 2) for p in range(ws) if p != r]:
                c.failures.append("any source n=%d: senders %s" % (n, got_from))
        dist.barrier(group=c4)
    # Receives are matched in issue order: a receive from any source issued before a receive from
    # rank 0 gets rank 0's first message when rank 0 is the only sender (only rank 1 receives).
    if r == 0:
        for k in range(2):
            dist.send(torch.full((3,), float(k)), 1, group=c4)
    elif r == 1:
        first, second = torch.empty(3), torch.empty(3)
        w1 = dist.irecv(first, group=c4)
        w2 = dist.irecv(second, src=0, group=c4)
        w1.wait()
        w2.wait()
        if w1._source_rank() != 0:
            c.failures.append("ordered: any source says %d" % w1._source_rank())
        c.equal("ordered: any source first", first, torch.zeros(3))
        c.equal("ordered: then from rank 0", second, torch.ones(3))
    dist.barrier(group=c4)
    return c.failures


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_recv_from_any_source(world_size):
    run_ranks(_any_source, world_size, timeout=300)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collectives_match_gloo(world_size):
    run_ranks(_collectives, world_size, timeout=300)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_alltoall_and_p2p_match_gloo(world_size):
    run_ranks(_alltoall_p2p, world_size, timeout=300)
