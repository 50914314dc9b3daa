"""Prefetch: the next unit's all_gather is issued before the current unit computes, and it
never keeps more than (current + max_inflight_all_gathers) units unsharded."""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist import comm
from minidist.fsdp import FSDP
from tests.common import MLP


def _gathers_issued_at_each_forward(prefetch: bool, k: int) -> list[int]:
    torch.manual_seed(0)
    model = FSDP(MLP(depth=5), wrap={nn.Linear}, forward_prefetch=prefetch, max_inflight_all_gathers=k)
    x = torch.randn(4, 13)
    model(x).sum().backward()  # first step records the order
    seen: list[int] = []
    with comm.trace() as tr:
        handles = [layer.register_forward_pre_hook(lambda *_: seen.append(
            sum(r.op == "all_gather" for r in tr.records))) for layer in model.module.layers]
        model(x).sum().backward()
    for h in handles:
        h.remove()
    return seen


def body_order() -> dict:
    return {(p, k): _gathers_issued_at_each_forward(p, k) for p, k in ((False, 2), (True, 1), (True, 2))}


def test_forward_prefetch_issues_ahead(run_dist):
    for seen in run_dist(2, body_order):
        # when layer i computes, all_gathers issued so far: its own and those of up to k layers ahead
        assert seen[(False, 2)] == [1, 2, 3, 4, 5], seen
        assert seen[(True, 1)] == [2, 3, 4, 5, 5], seen
        assert seen[(True, 2)] == [3, 4, 5, 5, 5], seen


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
        assert not any(u.shards.is_allocated for u in model.units), "unsharded buffers alive after backward"
    return out


def test_inflight_all_gathers_bounded(run_dist):
    for peaks in run_dist(2, body_peak_unsharded):
        # The root of this MLP holds no parameters: only the Linear units count.
        assert peaks[(False, False, 2)] == 1, peaks  # no prefetch: only the current unit
        for k in (0, 1, 2):
            assert peaks[(True, True, k)] == 1 + k, peaks  # bound reached, never exceeded
        assert peaks[(True, False, 2)] == 3 and peaks[(False, True, 2)] == 3, peaks


def body_last_unit_kept() -> dict:
    torch.manual_seed(0)
    model = FSDP(MLP(depth=3), wrap={nn.Linear})
    x = torch.randn(4, 13)
    out = {}
    for step in ("first", "second"):
        loss = model(x).sum()
        out[step, "after forward"] = [u.shards.is_allocated for u in model.units[1:]]
        loss.backward()
        out[step, "after backward"] = [u.shards.is_allocated for u in model.units[1:]]
    with torch.no_grad():
        model(x)
    out["no_grad forward"] = [u.shards.is_allocated for u in model.units[1:]]
    return out


def test_the_unit_that_ends_forward_stays_gathered_for_backward(run_dist):
    for out in run_dist(2, body_last_unit_kept):
        # the first forward only counts its post_forwards; from the second on, the last unit
        # (backward's first) keeps its params; backward frees it; a no_grad forward keeps nothing
        assert out["first", "after forward"] == [False, False, False], out
        assert out["second", "after forward"] == [False, False, True], out
        assert out["first", "after backward"] == out["second", "after backward"] == [False] * 3, out
        assert out["no_grad forward"] == [False] * 3, out
