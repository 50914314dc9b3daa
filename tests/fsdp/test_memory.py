"""ZeRO-3 memory: persistent params + grads + optimizer state per rank fall as 1/N."""

from __future__ import annotations

import torch

from minidist.fsdp import FSDP
from tests.fsdp.helpers import make_batches, make_model, train
from minidist.models.gpt import Block


def _persistent_bytes(model: FSDP, opt: torch.optim.Optimizer) -> int:
    total = 0
    for p in model.parameters():
        total += p.numel() * p.element_size()
        if p.grad is not None:
            total += p.grad.numel() * p.grad.element_size()
        for v in opt.state.get(p, {}).values():
            if torch.is_tensor(v) and v.dim() > 0:
                total += v.numel() * v.element_size()
    return total


def body_zero_bytes() -> tuple[int, int]:
    model = FSDP(make_model("gpt"), wrap={Block})
    opt = train("gpt", model, make_batches("gpt"), shard=True, steps=1)
    padded = sum(u.flat.padded for u in model.units)
    assert not any(u.flat.is_allocated for u in model.units)
    return _persistent_bytes(model, opt), padded


def test_zero3_memory_falls_as_one_over_n(run_dist):
    psi = sum(p.numel() for p in make_model("gpt").parameters())
    for world in (2, 4):
        results = run_dist(world, body_zero_bytes)
        per_rank = [b for b, _ in results]
        padded = results[0][1]
        # fp32 AdamW: 4 (param) + 4 (grad) + 8 (two moments) bytes per element, split N ways.
        assert sum(per_rank) == 16 * psi, (world, per_rank, psi)
        assert max(per_rank) <= 16 * padded // world, (world, per_rank)
        assert max(per_rank) < 16 * psi / world * 1.01, (world, per_rank)
