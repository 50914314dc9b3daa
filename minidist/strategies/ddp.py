"""strategy=ddp: minidist.DDP over "dp": every rank holds the whole model; gradients are all-reduced in buckets.

Bytes per step and rank: one all_reduce per gradient bucket, 2 S (N-1)/N (the ring's), S the
gradients' bytes; memory: (p + g + K) psi on every rank. A communication hook (strategy.comm_hook)
replaces the average: the bf16 hook of minidist.ddp.comm_hooks halves the bytes, and its record
would be this one with its own `collectives` (tests/strategies/test_new_strategy.py registers it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

from minidist.ddp import DDP
from minidist.ddp import footprint as ddp_footprint
from minidist.buckets.policy import ReducerPolicy
from minidist.mesh import ParallelDims
from minidist.strategies import contract
from minidist.strategies.record import DATA_PARALLEL, SETTINGS, Call, Strategy, engine_mesh
from minidist.strategies.registry import register
from minidist.strategies.schema import DataParallelStrategy, DType


@dataclass
class DDPStrategy(DataParallelStrategy):
    """minidist.DDP: every rank holds the whole model; gradients are all-reduced in buckets."""

    name: str = "ddp"
    """Strategy name (set by the preset; do not override)."""
    bucket_cap_mb: Optional[float] = None
    """Gradient MiB per all_reduce bucket: bigger = fewer, later collectives. null = torch's
    default: 25 MiB buckets after a 1 MiB first one (so the first all_reduce starts early)."""
    find_unused_parameters: bool = False
    """Tolerate parameters that get no gradient in a step (one small all_reduce of a used-bitmap per step)."""
    gradient_as_bucket_view: bool = False
    """Let .grad alias the bucket buffer (saves one gradient-sized copy)."""
    broadcast_buffers: bool = True
    """Broadcast buffers (BatchNorm statistics) from rank 0 before every forward."""
    comm_hook: Optional[str] = None
    """'module:function' of a DDP communication hook, or null for plain all_reduce."""
    reduce_dtype: Optional[DType] = None
    """Dtype gradients are all-reduced in (null = trainer.precision's: bf16/fp16 copies, fp32 otherwise)."""


def comm_hook(path: str | None) -> Callable | None:
    """The function strategy.comm_hook='module:function' names (None: DDP's own average)."""
    if not path:
        return None
    mod, _, fn = path.partition(":")
    if not fn:
        raise ValueError(f"strategy.comm_hook={path!r} must be 'module:function'")
    return getattr(importlib.import_module(mod), fn)


def dims(cfg, world: int, local_world: int | None = None) -> ParallelDims:
    """N / (T P C) replicas over "dp" (T = strategy.tp_size, P = strategy.pp_size, C = strategy.cp_size)."""
    return ParallelDims.infer(world, tp=cfg.get("tp_size", 1), pp=cfg.get("pp_size", 1), cp=cfg.get("cp_size", 1),
                              shard=1, settings=SETTINGS)


def wrap(model, layout, cfg, blocks, mp_policy):
    return DDP(model, mesh=engine_mesh(layout), bucket_cap_mb=cfg.bucket_cap_mb,
               find_unused_parameters=cfg.find_unused_parameters, gradient_as_bucket_view=cfg.gradient_as_bucket_view,
               broadcast_buffers=cfg.broadcast_buffers, comm_hook=comm_hook(cfg.comm_hook), mp_policy=mp_policy)


def policy(cfg) -> ReducerPolicy:
    """The reducer's bucket rules as the footprints read them."""
    return ReducerPolicy(cfg.get("bucket_cap_mb"), False, cfg.get("gradient_as_bucket_view", False))


def held(shape, cfg, world, group, *, optimizer, backend, device_type):
    hook = comm_hook(cfg.comm_hook)
    return ddp_footprint.held(shape, world, policy=policy(cfg), device_type=device_type, optimizer=optimizer,
                              backend=backend, **({"hook": hook} if hook else {}))


def bucket_all_reduces(shape, wire, world: int) -> list[Call]:
    """One all_reduce per gradient bucket: 2 S (N-1)/N per rank."""
    return [Call("all_reduce", x * wire.reduce_bytes(shape), world) for x in wire.buckets(shape)]


def reducer_buckets(model, optimizer) -> list[int]:
    return [sum(b.numels) for b in model.reducer.buckets]


DDP_RECORD = register(Strategy(
    name="ddp", summary="nothing", engine=f"minidist.DDP over {DATA_PARALLEL}", schema=DDPStrategy, zero_stage=0,
    closed_form="2S(N-1)/N", dims=dims, held=held,
    collectives=lambda shape, wire, world, group, grad_clip: bucket_all_reduces(shape, wire, world),
    wrap_model=wrap, model_engine=contract.ModelWrapper, buckets=reducer_buckets, one_rank_calls=("all_reduce",),
    default_rows=(1, 2)))
