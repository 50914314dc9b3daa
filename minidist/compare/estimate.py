"""Per-rank peak memory of a training step, predicted without running it.

    prof = profile_step(model_on_meta, batch, loss_fn, wrap={Block})      # once per model and batch
    est = estimate_memory(prof, "full_shard", world=8)                   # or (model_on_meta, ..., batch=, loss_fn=, wrap=)
    est.total, est.by_role, est.where

How: profile_step() records the plain model's step on fake tensors (activations, temporaries and
gradients after every operator, and which FSDP unit runs); the strategy's record says what its
engine holds at each instant of a step (its held(), the engines' minidist.footprint interface:
minidist/ddp/footprint.py, minidist/zero/footprint.py, minidist/fsdp/footprint.py). At every
profile sample, and at the instants only the engine knows (a unit's post_backward, the optimizer
step), the estimate adds the two; its peak is the prediction. Nothing here knows an engine's
schedule, or a strategy by name.

Model states alone are ZeRO's formulas (Rajbhandari et al. 2020, Figure 1), model_state_bytes():
psi parameters, N ranks, p bytes per parameter, g per gradient, K of optimizer state per parameter,
by the record's zero_stage (what it shards: 1 the optimizer state, 2 + gradients, 3 + parameters):

    ddp, no_shard    (p + g + K) psi               zero1, zero1_broadcast (P_os)  (p + g) psi + K psi / N
    zero2 (P_os+g)   p psi + (g + K) psi / N       shard_grad_op                  p psi + (g + K) psi / N
    full_shard       (p + g + K) psi / N           hybrid_shard (shard group G)   (p + g + K) psi / G

With the paper's mixed precision (fp16 parameters and gradients, p = g = 2, and Adam's fp32
master copy, momentum and variance, K = 12) that is 16 psi; training in fp32 it is (4 + 4 + K)
psi, K = 8 for AdamW (the weights are their own master copy): 16 psi too. G, the ranks a
strategy's states are split over, is its record's state_group(): hybrid_shard's shard group,
strategy.shard_size or else the processes per node, as at runtime.

Not counted: allocator rounding and caching, tensors on threads the profile cannot see (gloo's
workers, minidist's ring lane), the data pipeline. Checked against torch's allocator events
(minidist.compare.allocator) in tests/compare/test_measure.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
from omegaconf import OmegaConf

from minidist import strategies
from minidist.compare.profile import Sample, StepProfile, profile_step
from minidist.footprint import ROLES, Held, OptimizerModel

OPTIMIZERS = ("adamw", "sgd")


def model_state_bytes(psi: float, strategy: str, group: int, param_bytes: float = 4, grad_bytes: float = 4,
                      optim_bytes: float = 8) -> dict[str, float]:
    """ZeRO's per-rank model-state bytes (parameters, gradients, optimizer state, total) of `strategy`,
    its states split over `group` ranks (its state_group: the world, or hybrid_shard's shard group)."""
    return strategies.get(strategy).model_state_bytes(psi, group, param_bytes, grad_bytes, optim_bytes)


@dataclass
class MemoryEstimate:
    strategy: str
    world: int
    total: int = 0
    by_role: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    where: str = ""
    """The instant of the predicted peak, in words."""


def strategy_config(strategy, **options):
    """(record, config) of `strategy`: a registered name (its preset, `options` set on it) or a composed
    strategy config (e.g. the comparison's strategy_options.<name>; `options` set on a copy)."""
    if isinstance(strategy, str):
        record = strategies.get(strategy)
        return record, record.preset(**options)
    return strategies.get(strategy.name), (OmegaConf.merge(strategy, options) if options else strategy)


def held(prof: StepProfile, strategy, world: int, *, device: str = "cpu", optimizer: str = "adamw",
         backend: str = "gloo", local_world: int | None = None, group: int | None = None, **options) -> list[Held]:
    """What `strategy`'s engine holds at each instant of a step: its record's held() (minidist.footprint).

    strategy: a name or a strategy config; options: fields of its config to set (bucket_cap_mb,
    shard_size, prefetch, ...); group: the ranks its states are split over (default:
    its state_group at `world`, `local_world` processes per node; None: unknown, the whole world)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    record, cfg = strategy_config(strategy, **options)
    group = group or record.state_group(cfg, world, local_world)
    return record.held(prof.shape, cfg, world, group, optimizer=OptimizerModel(optimizer, device), backend=backend,
                       device_type=device)


def _lookup(rows: list[Held]) -> dict[tuple, Held]:
    out: dict[tuple, Held] = {}
    for h in rows:
        out.setdefault((h.at.phase, h.at.unit, h.at.stage), h)
        out.setdefault((h.at.phase, h.at.unit), h)
        out.setdefault((h.at.phase, None), h)
    return out


def _find(table: dict[tuple, Held], phase: str, unit: int, stage: int) -> Held:
    return table.get((phase, unit, stage)) or table.get((phase, unit)) or table[(phase, None)]


def _total(h: Held, smp: Sample | None) -> dict[str, int]:
    early = h.before_grads is not None and smp is not None and smp.backward and not smp.grads[h.at.unit or 0]
    roles = dict.fromkeys(ROLES, 0) | dict(h.before_grads if early else h.bytes)
    if smp is not None:
        roles["activations"] += smp.activations
        roles["other"] += smp.other
        units = range(len(smp.grads)) if h.plain_grads is None else h.plain_grads
        roles["gradients"] += sum(smp.grads[u] for u in units)
    return roles


def _instants(prof: StepProfile, rows: list[Held]):
    """(Held, the profile sample it is evaluated on) for every sample and every engine-only instant."""
    table = _lookup(rows)
    last_of: dict[int, Sample] = {}
    for smp in prof.samples:
        phase = "backward" if smp.backward else "forward"
        unit = prof.segments[smp.segment]
        stage = prof.root_stage(smp.segment, smp.backward) if unit == 0 else 0
        if smp.backward:
            last_of[unit] = smp
        yield _find(table, phase, unit, stage), smp
    for h in rows:
        if h.at.phase == "post_backward" and h.at.unit in last_of:
            yield h, last_of[h.at.unit]
        elif h.at.phase == "optimizer":
            yield h, None


def estimate_memory(prof: StepProfile | nn.Module, strategy, world: int, dtype: torch.dtype | None = None, *,
                    batch=None, loss_fn=None, wrap=None, device: str = "cpu", **settings) -> MemoryEstimate:
    """Predicted per-rank peak bytes of one step of `strategy` (a name or a strategy config) at `world` ranks
    (see the module docstring).

    prof: profile_step() of the model with one rank's batch, or the model itself built on the meta
    device (then batch (meta tensors), loss_fn(model, batch) -> loss and wrap (the FSDP block types)
    are needed, and dtype casts it first; profiling once and passing the profile is cheaper for
    many strategies and worlds). settings: held()'s (optimizer, backend, local_world, group, and
    fields of the strategy's config: bucket_cap_mb, shard_size, prefetch, ...).
    """
    if isinstance(prof, nn.Module):
        if batch is None or loss_fn is None:
            raise ValueError("estimate_memory(model, ...) needs batch= (meta tensors of one rank's batch) and "
                             "loss_fn=(model, batch) -> loss, or a StepProfile from profile_step()")
        prof = profile_step(prof.to(dtype) if dtype is not None else prof, batch, loss_fn, wrap, device)
    name = strategy if isinstance(strategy, str) else strategy.name
    best = MemoryEstimate(name, world)
    for h, smp in _instants(prof, held(prof, strategy, world, device=device, **settings)):
        roles = _total(h, smp)
        total = sum(roles.values())
        if total > best.total:
            best = MemoryEstimate(name, world, total, roles, h.note or h.at.phase)
    return best
