"""K AdamW steps of FSDP at world N == one process on the whole batch (fp32, 1e-6).

Covers every sharding strategy (FSDP2's arguments), prefetch by default, off and two units
ahead (explicit lists), with and without a wrap policy,
on models whose sizes the world size does not divide, tied weights (TiedLM, GPT),
a unit called twice per forward, a frozen layer and a parameter outside every unit.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from minidist import runtime
from minidist.fsdp import FSDP, prefetch_ahead
from minidist.mesh import hybrid_mesh
from tests.fsdp.helpers import WRAPS, fsdp2_args, loss_of, make_batches, make_model, max_diff, reference, train

TOL = 1e-6


@functools.lru_cache(maxsize=None)
def _reference(kind: str, world: int):
    return reference(kind, world)


def _run(kind: str, wrap: bool, prefetch: int | None = None, **fsdp_kwargs) -> float:
    model = FSDP(make_model(kind), wrap=WRAPS[kind] if wrap else None, **fsdp_kwargs)
    if prefetch is not None:
        prefetch_ahead(model.units, prefetch, prefetch)
    batches = make_batches(kind)
    train(kind, model, batches, shard=True)
    with torch.no_grad():  # an evaluation forward leaves every unit sharded (shard_grad_op too)
        loss_of(kind, model, *batches[0])
    return max_diff(model.full_state_dict(rank0_only=False), _reference(kind, dist.get_world_size()))


def body_strategies(kinds: list[str], strategies: list[str], prefetch_variants: bool) -> dict:
    out = {}
    for strategy in strategies:
        for kind in kinds:
            for wrap in (False, True):
                out[(strategy, kind, wrap)] = _run(kind, wrap, **fsdp2_args(strategy))
    for kind in kinds if prefetch_variants else []:  # prefetch off, and two units ahead
        out[("no-prefetch", kind)] = _run(kind, True, prefetch=0)
        out[("prefetch-2", kind)] = _run(kind, True, prefetch=2)
    return out


def body_hybrid(kinds: list[str]) -> dict:
    mesh = hybrid_mesh(runtime.init("gloo"), shard=2)
    return {("hybrid", kind, wrap): _run(kind, wrap, mesh=mesh)
            for kind in kinds for wrap in (False, True)}


def _check(results):
    for per_rank in results:
        for cfg, diff in per_rank.items():
            assert diff < TOL, f"{cfg}: max |fsdp - reference| = {diff}"


def test_all_strategies_world2(run_dist):
    _check(run_dist(2, body_strategies, ["mlp", "tied", "gpt", "twice"],
                    ["full_shard", "shard_grad_op", "no_shard"], True))


def test_uneven_world3(run_dist):
    _check(run_dist(3, body_strategies, ["mlp", "gpt"], ["full_shard", "shard_grad_op"], False))


def test_hybrid_2x2_world4(run_dist):
    _check(run_dist(4, body_hybrid, ["mlp", "gpt"]))
