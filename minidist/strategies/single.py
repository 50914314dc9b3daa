"""strategy=single: one process, no wrapper, a plain optimizer: the reference every other strategy must match."""

from __future__ import annotations

from dataclasses import dataclass

from minidist.ddp import footprint as ddp_footprint
from minidist.buckets.policy import ReducerPolicy
from minidist.mesh import ParallelDims
from minidist.strategies.record import SETTINGS, Strategy
from minidist.strategies.registry import register


@dataclass
class SingleStrategy:
    """One process, no wrapper: the reference every other strategy must match."""

    name: str = "single"
    """Strategy name (set by the preset; do not override)."""


def _dims(cfg, world: int, local_world: int | None = None) -> ParallelDims:
    if world != 1:
        raise ValueError(f"strategy=single runs one process, but this job has {world}; "
                         f"use strategy=ddp (or another data-parallel strategy) under torchrun")
    return ParallelDims.infer(world, settings=SETTINGS)


def _held(shape, cfg, world, group, *, optimizer, backend, device_type):
    """The plain model's step: DDP's footprint without its reducer."""
    return ddp_footprint.held(shape, world, policy=ReducerPolicy(), device_type=device_type, optimizer=optimizer,
                              backend=backend, reducer=False)


SINGLE = register(Strategy(
    name="single", summary="nothing (one process)", engine="no wrapper, one process", schema=SingleStrategy,
    zero_stage=0, closed_form="0", dims=_dims, held=_held, collectives=lambda *_a, **_k: [], comparable=False))
