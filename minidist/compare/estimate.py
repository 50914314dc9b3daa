"""Per-rank peak memory of a training step, predicted without running it.

    prof = profile_step(model_on_meta, batch, loss_fn, wrap={Block})      # once per model and batch
    est = estimate_memory(prof, "full_shard", world=8)                   # or (model_on_meta, ..., batch=, loss_fn=, wrap=)
    est.total, est.by_role, est.where

How: profile_step() records the plain model's step on fake tensors (activations, temporaries and
gradients after every operator, and which FSDP unit runs); the engine says what it holds at each
instant of a step (its held(), the minidist.footprint interface: minidist/ddp/footprint.py,
minidist/zero/footprint.py, minidist/fsdp/footprint.py). At every profile sample, and at the
instants only the engine knows (a unit's post_backward, the optimizer step), the estimate adds
the two; its peak is the prediction. Nothing here knows an engine's schedule.

Model states alone are ZeRO's formulas (Rajbhandari et al. 2020, Figure 1), model_state_bytes():
psi parameters, N ranks, p bytes per parameter, g per gradient, K of optimizer state per parameter:

    ddp              (p + g + K) psi               zero1, zero1_broadcast (P_os)  (p + g) psi + K psi / N
    zero2 (P_os+g)   p psi + (g + K) psi / N       shard_grad_op                  p psi + (g + K) psi / N
    full_shard       (p + g + K) psi / N           hybrid_shard (shard group G)   (p + g + K) psi / G

With the paper's mixed precision (fp16 parameters and gradients, p = g = 2, and Adam's fp32
master copy, momentum and variance, K = 12) that is 16 psi; training in fp32 it is (4 + 4 + K)
psi, K = 8 for AdamW (the weights are their own master copy): 16 psi too.

Not counted: allocator rounding and caching, tensors on threads the profile cannot see (gloo's
workers, minidist's ring lane), the data pipeline. Checked against torch's allocator events
(minidist.compare.allocator) in tests/compare/test_measure.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from minidist.compare.profile import Sample, StepProfile, profile_step
from minidist.ddp import footprint as ddp_footprint
from minidist.buckets.policy import ReducerPolicy
from minidist.footprint import ROLES, Held, OptimizerModel
from minidist.fsdp import footprint as fsdp_footprint
from minidist.zero import footprint as zero_footprint

OPTIMIZERS = ("adamw", "sgd")
STAGE = {"single": 0, "ddp": 0, "no_shard": 0, "zero1": 1, "zero1_broadcast": 1, "zero2": 2, "shard_grad_op": 2,
         "full_shard": 3, "hybrid_shard": 3}
"""What each strategy shards, as a ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters."""


def model_state_bytes(psi: float, strategy: str, world: int, param_bytes: float = 4, grad_bytes: float = 4,
                      optim_bytes: float = 8) -> dict[str, float]:
    """ZeRO's per-rank model-state bytes (parameters, gradients, optimizer state, total)."""
    if strategy not in STAGE:
        raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STAGE)}")
    stage, n = STAGE[strategy], world
    out = {"parameters": param_bytes * psi / (n if stage >= 3 else 1),
           "gradients": grad_bytes * psi / (n if stage >= 2 else 1),
           "optimizer": optim_bytes * psi / (n if stage >= 1 else 1)}
    return out | {"total": sum(out.values())}


@dataclass
class MemoryEstimate:
    strategy: str
    world: int
    total: int = 0
    by_role: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    where: str = ""
    """The instant of the predicted peak, in words."""


def held(prof: StepProfile, strategy: str, world: int, *, device: str = "cpu", optimizer: str = "adamw",
         shard_size: int | None = None, backend: str = "gloo", bucket_cap_mb: float | None = None,
         gradient_as_bucket_view: bool = False, **fsdp) -> list[Held]:
    """What `strategy`'s engine holds at each instant of a step: the engine's own held() (minidist.footprint).

    fsdp: FSDP's settings (prefetch: units gathered ahead of use)."""
    if strategy not in STAGE:
        raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STAGE)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    opt = OptimizerModel(optimizer, device)
    policy = ReducerPolicy(bucket_cap_mb, False, gradient_as_bucket_view)
    if strategy in fsdp_footprint.STRATEGIES:
        return fsdp_footprint.held(prof.layout, strategy, world, shard_size=shard_size, optimizer=opt, backend=backend,
                                   device_type=device, **fsdp)
    if strategy in ("zero1", "zero2"):
        return zero_footprint.held(prof.layout, world, stage=int(strategy[-1]), policy=policy, device_type=device,
                                   optimizer=opt)
    if strategy == "zero1_broadcast":
        return zero_footprint.held_broadcast(prof.layout, world, policy=policy, device_type=device, optimizer=opt,
                                             backend=backend)
    return ddp_footprint.held(prof.layout, world, policy=policy, device_type=device, optimizer=opt, backend=backend,
                              reducer=strategy != "single")


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


def estimate_memory(prof: StepProfile | nn.Module, strategy: str, world: int, dtype: torch.dtype | None = None, *,
                    batch=None, loss_fn=None, wrap=None, device: str = "cpu", **settings) -> MemoryEstimate:
    """Predicted per-rank peak bytes of one step of `strategy` at `world` ranks (see the module docstring).

    prof: profile_step() of the model with one rank's batch, or the model itself built on the meta
    device (then batch (meta tensors), loss_fn(model, batch) -> loss and wrap (the FSDP block types)
    are needed, and dtype casts it first; profiling once and passing the profile is cheaper for
    many strategies and worlds). settings: held()'s (optimizer, shard_size, backend, bucket_cap_mb,
    gradient_as_bucket_view, prefetch).
    """
    if isinstance(prof, nn.Module):
        if batch is None or loss_fn is None:
            raise ValueError("estimate_memory(model, ...) needs batch= (meta tensors of one rank's batch) and "
                             "loss_fn=(model, batch) -> loss, or a StepProfile from profile_step()")
        prof = profile_step(prof.to(dtype) if dtype is not None else prof, batch, loss_fn, wrap, device)
    best = MemoryEstimate(strategy, world)
    for h, smp in _instants(prof, held(prof, strategy, world, device=device, **settings)):
        roles = _total(h, smp)
        total = sum(roles.values())
        if total > best.total:
            best = MemoryEstimate(strategy, world, total, roles, h.note or h.at.phase)
    return best

