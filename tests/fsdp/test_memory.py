"""ZeRO-3 memory: persistent params + grads + optimizer state per rank fall as 1/N.

Per-parameter dim-0 sharding puts ceil(R/N) rows of each parameter on the first ranks, so
the split is even only up to those rows: each rank holds at most 16 sum_p ceil(R_p/N) C_p
bytes (fp32 AdamW), every element exactly once across ranks (16 psi in all), and exactly
what torch's fully_shard holds on the same rank (its torch.chunk split is the same). The
original, unsharded parameters are freed once wrapped: nothing keeps the whole model alive.
"""

from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist

from minidist.fsdp import FSDP
from minidist.models.gpt import Block
from tests.fsdp.helpers import make_batches, make_model, train


def _persistent_bytes(model, opt: torch.optim.Optimizer) -> int:
    def nbytes(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t  # torch's FSDP2 parameters are DTensors
        return t.numel() * t.element_size()

    total = 0
    for p in model.parameters():
        total += nbytes(p) + (nbytes(p.grad) if p.grad is not None else 0)
        total += sum(nbytes(v) for v in opt.state.get(p, {}).values() if torch.is_tensor(v) and v.dim() > 0)
    return total


def body_persistent() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    plain = make_model("gpt")
    originals = [weakref.ref(p) for p in plain.parameters()]
    ours = FSDP(plain, wrap={Block})
    del plain
    gc.collect()
    alive = sum(r() is not None for r in originals)
    ours_opt = train("gpt", ours, make_batches("gpt"), shard=True, steps=1)
    assert not any(u.shards.is_allocated for u in ours.units)
    theirs = make_model("gpt")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in theirs.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(theirs, mesh=mesh)
    theirs_opt = train("gpt", theirs, make_batches("gpt"), shard=True, steps=1)
    return {"ours": _persistent_bytes(ours, ours_opt), "torch": _persistent_bytes(theirs, theirs_opt),
            "originals_alive": alive}


def test_zero3_memory_falls_as_one_over_n(run_dist):
    params = list(make_model("gpt").parameters())
    psi = sum(p.numel() for p in params)
    for world in (2, 4):
        results = run_dist(world, body_persistent, allow_warnings=True)  # fully_shard may warn on gloo
        ours = [r["ours"] for r in results]
        # fp32 AdamW: 4 (param) + 4 (grad) + 8 (two moments) bytes per element, each element on one rank
        assert sum(ours) == 16 * psi, (world, ours, psi)
        rows_bound = 16 * sum(-(-p.shape[0] // world) * (p.numel() // p.shape[0]) for p in params)
        assert max(ours) <= rows_bound, (world, ours, rows_bound)
        assert ours == [r["torch"] for r in results], (world, results)
        assert all(r["originals_alive"] == 0 for r in results), results
