"""strategy=zero1, zero2, zero1_broadcast: minidist.ShardedOptimizer over "dp"; the model is not wrapped.

    zero1            the paper's ZeRO-1: optimizer state sharded; per bucket a reduce_scatter of the
                     gradients in backward and an all_gather of the updated shards after the step,
                     2 S (N-1)/N per rank (an all_reduce's bytes, split in two)
    zero2            + the gradients sharded (a bucket's buffer freed once reduced): the same bytes
    zero1_broadcast  torch's ZeroRedundancyOptimizer: whole parameters, DDP's all_reduce, then one
                     broadcast per owner of its updated share, 3 S (N-1)/N
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minidist.buckets.policy import ReducerPolicy
from minidist.strategies import contract, ddp
from minidist.strategies.record import DATA_PARALLEL, Call, Strategy, clip_call, engine_mesh, padded
from minidist.strategies.registry import register
from minidist.strategies.schema import DataParallelStrategy, DType
from minidist.zero import ShardedOptimizer
from minidist.zero import footprint as zero_footprint


@dataclass
class ZeroStrategy(DataParallelStrategy):
    """minidist.ShardedOptimizer: ZeRO-1 (optimizer state sharded), ZeRO-2 (+ gradients), or zero1_broadcast
    (torch's ZeroRedundancyOptimizer design: whole parameters, all_reduce, one broadcast per owner)."""

    name: str = "zero1"
    """Strategy name: zero1, zero2 or zero1_broadcast (set by the preset; do not override)."""
    bucket_cap_mb: Optional[float] = None
    """Gradient MiB per reduce_scatter (and parameter all_gather) bucket; null = DDP's default."""
    overlap_param_gather: bool = False
    """Let step() return with the parameter all_gathers in flight; each layer waits for its own just before
    its forward (zero1, zero2)."""
    reduce_dtype: Optional[DType] = None
    """Dtype gradients are reduce-scattered in (null = trainer.precision's)."""


def _policy(cfg) -> ReducerPolicy:
    return ReducerPolicy(cfg.bucket_cap_mb, False, False)


def engine_buckets(model, optimizer) -> list[int]:
    """The engine's buckets: its flat partitions padded to N (the owner-broadcast variant's reducer's)."""
    return optimizer.engine.buffer_numels()


def _paper(stage: int, closed_form: str) -> Strategy:
    """The paper's ZeRO-`stage` (flat partitions, reduce_scatter and all_gather per bucket)."""

    def build(model, layout, cfg, optim_cls, optim_kwargs, mp_policy):
        return ShardedOptimizer(list(model.parameters()), optim_cls, mesh=engine_mesh(layout), module=model,
                                bucket_cap_mb=cfg.bucket_cap_mb, stage=stage, mp_policy=mp_policy,
                                overlap_param_gather=cfg.overlap_param_gather, **optim_kwargs)

    def held(shape, cfg, world, group, *, optimizer, backend, device_type):
        return zero_footprint.held(shape, world, stage=stage, policy=_policy(cfg), device_type=device_type,
                                   optimizer=optimizer)

    def collectives(shape, wire, world, group, grad_clip) -> list[Call]:
        """Per bucket (as built: padded to N; else padded here) a reduce_scatter, then the all_gather after step."""
        g_b, p_b = wire.reduce_bytes(shape), wire.gather_bytes(shape)
        calls = [c for x in wire.buckets(shape) for c in (
            Call("reduce_scatter", padded(x, world) * g_b, world),
            Call("all_gather", padded(x, world) * p_b, world, phase="after"))]
        return calls + (clip_call(world) if grad_clip else [])

    return Strategy(
        name=f"zero{stage}", summary="optimizer state" + (" and gradients" if stage == 2 else ""),
        engine=f"minidist.ShardedOptimizer(stage={stage}) over {DATA_PARALLEL}, no model wrapper", schema=ZeroStrategy,
        zero_stage=stage, closed_form=closed_form, dims=ddp.dims, held=held, collectives=collectives,
        build_optimizer=build, optimizer_engine=contract.ShardedOptimizerState, buckets=engine_buckets,
        one_rank_calls=("reduce_scatter", "all_gather"), default_rows=(1,))


def _build_broadcast(model, layout, cfg, optim_cls, optim_kwargs, mp_policy):
    return ShardedOptimizer(list(model.parameters()), optim_cls, mesh=engine_mesh(layout), module=model,
                            bucket_cap_mb=cfg.bucket_cap_mb, owner_broadcast=True, **optim_kwargs)


def _held_broadcast(shape, cfg, world, group, *, optimizer, backend, device_type):
    return zero_footprint.held_broadcast(shape, world, policy=_policy(cfg), device_type=device_type,
                                         optimizer=optimizer, backend=backend)


def _broadcast_calls(shape, wire, world, group, grad_clip) -> list[Call]:
    """DDP's all_reduces, then each owner broadcasts its updated share (N-1 of N ranks send each)."""
    if shape.shapes_known:
        shares = [sum(s) for s in zero_footprint.owner_shares(shape.param_numels, world) if s]
    else:  # a model known by its size: N equal shares
        shares = [shape.psi // world] * world
    return ddp.bucket_all_reduces(shape, wire, world) + [
        Call("broadcast", s * wire.gather_bytes(shape), world, phase="after") for s in shares]


ZERO1 = register(_paper(1, "2S(N-1)/N"))
ZERO2 = register(_paper(2, "2S(N-1)/N"))
ZERO1_BROADCAST = register(Strategy(
    name="zero1_broadcast", summary="optimizer state, by whole parameters",
    engine=f"minidist.ShardedOptimizer(owner_broadcast=True) over {DATA_PARALLEL}, no model wrapper",
    schema=ZeroStrategy,
    zero_stage=1, closed_form="3S(N-1)/N", dims=ddp.dims, held=_held_broadcast, collectives=_broadcast_calls,
    build_optimizer=_build_broadcast, optimizer_engine=contract.ShardedOptimizerState, buckets=engine_buckets,
    one_rank_calls=("all_reduce",), default_rows=(1,)))
