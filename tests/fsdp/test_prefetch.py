"""Prefetch, FSDP2's way: by default each unit issues the next unit's all_gather before it computes;
explicit lists (FSDPUnit.set_modules_to_forward_prefetch / set_modules_to_backward_prefetch, or
prefetch_ahead by module order) replace that, and the units unsharded at once follow them."""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist import comm
from minidist.fsdp import FSDP, prefetch_ahead
from tests.common import MLP


def _gathers_issued_at_each_forward(setup) -> list[int]:
    torch.manual_seed(0)
    model = FSDP(MLP(depth=5), wrap={nn.Linear})
    setup(model.units)
    x = torch.randn(4, 13)
    model(x).sum().backward()  # first step records the order (the default's)
    seen: list[int] = []
    with comm.trace() as tr:
        handles = [layer.register_forward_pre_hook(lambda *_: seen.append(
            sum(r.op == "all_gather" for r in tr.records))) for layer in model.module.layers]
        model(x).sum().backward()
    for h in handles:
        h.remove()
    return seen


def _only_first_to_third(units) -> None:
    prefetch_ahead(units, 0, 0)
    units[1].set_modules_to_forward_prefetch([units[3]])


SETUPS = {"off": lambda u: prefetch_ahead(u, 0, 0), "default": lambda u: None,
          "two ahead": lambda u: prefetch_ahead(u, 2, 2), "first -> third": _only_first_to_third}


def body_order() -> dict:
    return {name: _gathers_issued_at_each_forward(setup) for name, setup in SETUPS.items()}


def test_forward_prefetch_issues_ahead(run_dist):
    for seen in run_dist(2, body_order):
        # when layer i computes, all_gathers issued so far: its own and those its unit prefetched
        assert seen["off"] == [1, 2, 3, 4, 5], seen
        assert seen["default"] == [2, 3, 4, 5, 5], seen
        assert seen["two ahead"] == [3, 4, 5, 5, 5], seen
        assert seen["first -> third"] == [2, 3, 3, 4, 5], seen  # the third layer came early, nothing else


def body_peak_unsharded() -> dict:
    """Peak count of units whose unsharded buffer is allocated, sampled at every allocation
    (the only moments the count grows), over a warm-up step and a prefetching step."""
    out = {}
    for ahead in (None, (0, 0), (1, 1), (2, 2), (2, 0), (0, 2)):
        torch.manual_seed(0)
        model = FSDP(MLP(depth=6), wrap={nn.Linear})
        if ahead is not None:
            prefetch_ahead(model.units, *ahead)
        x = torch.randn(4, 13)
        model(x).sum().backward()  # first step: records the order
        model._schedule.peak_live = 0
        model(x).sum().backward()
        out[ahead] = model.peak_unsharded_units
        assert not any(u.shards.is_allocated for u in model.units), "unsharded buffers alive after backward"
    return out


def test_units_unsharded_at_once_follow_the_lists(run_dist):
    for peaks in run_dist(2, body_peak_unsharded):
        # The root of this MLP holds no parameters: only the Linear units count.
        assert peaks[None] == peaks[(1, 1)] == 2, peaks  # the default is one unit ahead
        assert peaks[(0, 0)] == 1, peaks  # no prefetch: only the current unit
        assert peaks[(2, 2)] == peaks[(2, 0)] == peaks[(0, 2)] == 3, peaks


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
