"""Memory: prefetch never keeps more than (current + max_inflight_all_gathers) units
unsharded, and persistent params + grads + optimizer state per rank fall as 1/N."""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.fsdp import FSDP
from tests.common import MLP
from tests.fsdp.helpers import make_batches, make_model, train
from minidist.models.gpt import Block


def body_peak_unsharded() -> dict:
    """Peak count of units whose unsharded buffer is allocated, sampled at every allocation
    (the only moments the count grows), over a warm-up step and a prefetching step."""
    out = {}
    configs = [(False, False, 2), (True, True, 0), (True, True, 1), (True, True, 2), (True, False, 2), (False, True, 2)]
    for fwd, bwd, k in configs:
        torch.manual_seed(0)
        model = FSDP(MLP(depth=6), wrap={nn.Linear}, forward_prefetch=fwd, backward_prefetch=bwd,
                     max_inflight_all_gathers=k)
        x = torch.randn(4, 13)
        model(x).sum().backward()  # first step: records the order, no prefetch
        model._schedule.peak_live = 0
        model(x).sum().backward()
        out[(fwd, bwd, k)] = model.peak_unsharded_units
        assert not any(u.flat.is_allocated for u in model.units), "unsharded buffers alive after backward"
    return out


def test_inflight_all_gathers_bounded(run_dist):
    for peaks in run_dist(2, body_peak_unsharded):
        # The root of this MLP holds no parameters: only the Linear units count.
        assert peaks[(False, False, 2)] == 1, peaks  # no prefetch: only the current unit
        for k in (0, 1, 2):
            assert peaks[(True, True, k)] == 1 + k, peaks  # bound reached, never exceeded
        assert peaks[(True, False, 2)] == 3 and peaks[(False, True, 2)] == 3, peaks


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
