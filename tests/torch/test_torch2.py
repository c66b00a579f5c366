"""PyTorch 2.x workloads over backend c4 (skipped on torch 1.x): FSDP2, a 2-D DeviceMesh with DTensor
and tensor parallelism, and torch.distributed.checkpoint, each checked against a reference.

- FSDP2 (fully_shard) trains a small transformer once over a c4 mesh and once over a gloo mesh in
  the same processes: the parameters must agree (rtol 1e-4: the two may sum in different orders).
- DeviceMesh 2x2 (dp x tp) with c4 as the default backend: DTensor sharding, redistribution along
  each mesh dimension and a matmul, against the same computation on full tensors (exact), and a
  column/row tensor-parallel MLP whose output and gradients match the unsharded MLP's.
- torch.distributed.checkpoint: an FSDP2 model's state saved, disturbed, loaded back, over c4.
"""

import functools

import pytest

from harness import run_ranks, torch2_only

pytestmark = torch2_only("FSDP2, DeviceMesh, DTensor")


def _transformer(torch):
    torch.manual_seed(0)
    layers = [torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                               batch_first=True) for _ in range(2)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(32, 8))


def _fsdp2_train(group, rank, steps=5):
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    model = _transformer(torch)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(4, 6, 32, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])


def _fsdp2(ctx):
    import torch

    failures = []
    ref = _fsdp2_train(ctx.gloo, ctx.rank)
    got = _fsdp2_train(ctx.c4, ctx.rank)
    if not torch.allclose(got, ref, rtol=1e-4, atol=1e-5):
        failures.append("FSDP2 over c4 vs gloo: max abs diff %g" % (got - ref).abs().max().item())
    initial = torch.cat([p.detach().reshape(-1) for p in _transformer(torch).parameters()])
    if torch.equal(got, initial):
        failures.append("FSDP2 did not change the parameters")
    return failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp2_matches_gloo(world_size):
    run_ranks(_fsdp2, world_size, timeout=300)


def _mesh2d(ctx):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    failures = []
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        backend = torch.distributed.get_backend(mesh.get_group(dim))
        if backend != "c4":
            failures.append("mesh dimension %s runs on %s, not c4" % (dim, backend))
    gen = torch.Generator().manual_seed(7)  # the same full tensors on every rank
    a = torch.randint(-8, 8, (8, 6), generator=gen).double()
    b = torch.randint(-8, 8, (6, 4), generator=gen).double()
    da = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
    db = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
    checks = {
        "shard/shard -> replicate": (da.redistribute(mesh, [Replicate(), Replicate()]).to_local(), a),
        "shard(0) -> shard(1) on dp": (da.redistribute(mesh, [Shard(1), Shard(1)]).full_tensor(), a),
        "matmul": ((da @ db).full_tensor(), a @ b),
        "sum": (da.sum().full_tensor(), a.sum()),
        "add": ((da + da).full_tensor(), a + a),
    }
    for name, (got, want) in checks.items():
        if not torch.equal(got, want):
            failures.append("DTensor %s: max diff %g" % (name, (got - want).abs().max().item()))

    # Tensor parallel over "tp" (column then row), data parallel inputs per "dp" row.
    torch.manual_seed(3)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).double()
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).double()
    ref.load_state_dict(mlp.state_dict())
    tp = parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(11 + mesh.get_coordinate()[0])).double()
    out = tp(x)
    want = ref(x)
    if not torch.allclose(out, want, rtol=1e-12, atol=1e-12):
        failures.append("tensor-parallel MLP output: max diff %g" % (out - want).abs().max().item())
    out.sum().backward()
    want.sum().backward()
    for (name, p), q in zip(tp.named_parameters(), ref.parameters()):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if not torch.allclose(g, q.grad, rtol=1e-12, atol=1e-12):
            failures.append("tensor-parallel gradient of %s: max diff %g" % (name, (g - q.grad).abs().max().item()))
    return failures


def test_device_mesh_2d_dtensor_and_tensor_parallel():
    run_ranks(_mesh2d, 4, timeout=300, with_gloo=False)


def _checkpoint(ctx, path):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    failures = []
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model = _transformer(torch)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    saved = {k: v.full_tensor().clone() for k, v in get_model_state_dict(model).items()}
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0).add_(1)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    for k, v in get_model_state_dict(model).items():
        if not torch.equal(v.full_tensor(), saved[k]):
            failures.append("checkpoint: %s differs after load" % k)
    return failures


def test_distributed_checkpoint_save_load(tmp_path):
    run_ranks(functools.partial(_checkpoint, path=str(tmp_path / "ckpt")), 2, timeout=300, with_gloo=False)
