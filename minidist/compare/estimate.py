"""Per-rank peak memory of a training step, predicted without running it.

    prof = profile_step(model_on_meta, batch, loss_fn, wrap={Block})      # once per model and batch
    est = estimate_memory(prof, "full_shard", world=8)                   # or (model_on_meta, ..., batch=, loss_fn=, wrap=)
    est.total, est.by_role, est.where

Model states at rest are ZeRO's formulas (Rajbhandari et al. 2020, Figure 1), model_state_bytes():
psi parameters, N ranks, p bytes per parameter, g per gradient, K of optimizer state per parameter:

    ddp            (p + g + K) psi                 ZeRO-1 (P_os)        (p + g) psi + K psi / N
    shard_grad_op  p psi + (g + K) psi / N         full_shard (P_os+g+p)  (p + g + K) psi / N

With fp16 parameters and gradients and mixed-precision Adam (K = 12: fp32 master, momentum,
variance) that is the paper's 16 psi; training in fp32 it is (4 + 4 + K) psi, K = 8 for AdamW
(the weights are their own master copy).

The peak of a step is more than states at rest: the activations saved for backward, the
engines' buffers and gradients in flight coexist. profile_step() records the plain model's
step on fake tensors; for each of its samples (and for the optimizer step) this module adds
what the engine holds at that point, by the engine's own rules:

    ddp, zero1_broadcast  whole parameters; gradient buckets (a second copy of the gradients, kept
                    for the whole run); the plain model's gradients as backward produces them.
                    zero1_broadcast: K psi / N (its largest share), and after step() every share is
                    broadcast from its owner: p psi of flat buffers at once
    zero1, zero2    flat partitions (minidist.zero): K psi / N and the partition's gradient; zero1
                    keeps one whole gradient buffer (g psi, reduced in place), zero2 holds its
                    buckets only while they reduce (bounded here by g psi in backward, none after)
    FSDP            this rank's shards (padded to a multiple of N); the units unsharded at that
                    point of the schedule: full_shard, the root (it encloses every other unit),
                    the running unit and max_inflight prefetched ones; shard_grad_op, every unit
                    gathered so far in forward until its own backward ends. In backward the running
                    unit's (and the root's) unsharded gradients, the previous unit's padded flat
                    still in its reduce_scatter, and the reduced shards of the units done
    optimizer step  complete gradients, plus single-tensor AdamW's temporaries: two tensors
                    the size of the largest parameter (piece) it updates
    gloo            its native reduce_scatter all-reduces a copy of the input: one more padded unit
                    (not with minidist's ring, the default on gloo: see minidist.comm.ring)
                    while a unit's post_backward waits for the previous unit's reduction

Assumes, like the engines' defaults, a root unit around a sequence of wrapped blocks.
Not counted: allocator rounding and fragmentation, scratch a backend keeps out of sight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from minidist.compare.analytic import zero1_partition
from minidist.compare.memory import ROLES
from minidist.compare.profile import Sample, StepProfile, profile_step
from minidist.comm.ring import algorithm_for
from minidist.fsdp.schedule import DEFAULT_MAX_INFLIGHT_ALL_GATHERS

OPTIMIZER_STATE_TENSORS = {"adamw": 2, "sgd": 1}
"""Parameter-sized state tensors: AdamW's two moments, SGD's momentum buffer. K = that x itemsize
(8 bytes per parameter for fp32 AdamW): torch's optimizers keep state in the parameters' dtype."""
STAGE = {"single": 0, "ddp": 0, "no_shard": 0, "zero1": 1, "zero1_broadcast": 1, "zero2": 2, "shard_grad_op": 2,
         "full_shard": 3, "hybrid_shard": 3}
"""What each strategy shards, as a ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters."""
FSDP_NAMES = ("shard_grad_op", "full_shard", "hybrid_shard", "no_shard")


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
    """forward, backward or optimizer: the instant of the predicted peak."""


@dataclass(frozen=True)
class _Layout:
    """One strategy's bytes on rank 0 (the rank with the most state), at rest."""

    params: int
    optimizer: int
    buckets: int = 0
    step_buffers: int = 0
    opt_temp: int = 0
    full: tuple[int, ...] = ()
    """FSDP: padded bytes of each unit unsharded (and of its gradient flat)."""
    shard: tuple[int, ...] = ()
    """FSDP: bytes of each unit's shard (its reduced gradient)."""


def _layout(prof: StepProfile, strategy: str, world: int, k: int, shard_size: int | None) -> _Layout:
    b = prof.itemsize
    step_b = 4 if k else 0  # AdamW keeps a 0-dim fp32 step counter per parameter tensor
    if strategy not in FSDP_NAMES:
        params, psi = prof.param_numels, prof.psi
        mine = params
        if strategy == "zero1_broadcast":  # the rank with the largest share sets the peak
            mine = max(zero1_partition(params, world), key=sum)
        if strategy in ("zero1", "zero2"):  # one partition per bucket; a bound: one bucket
            mine = [-(-psi // world)]
        return _Layout(params=psi * b, optimizer=k * sum(mine) + step_b * len(mine),
                       buckets=0 if strategy in ("single", "zero2") else psi * b,
                       step_buffers=psi * b if strategy == "zero1_broadcast" and world > 1 else 0,
                       opt_temp=2 * max(mine) * b if k else 0,
                       shard=(sum(mine) * b,) if strategy == "zero2" else ())
    n = 1 if strategy == "no_shard" else (shard_size or world) if strategy == "hybrid_shard" else world
    # rank 0 holds ceil(R/n) rows of every parameter (the most of any rank); a unit gathers n times that
    pieces = [[-(-r // n) * c for r, c in rows] for rows in prof.unit_param_rows]
    shards = [sum(ps) for ps in pieces]
    padded = [n * s for s in shards]
    flat = [x for ps in pieces for x in ps]
    return _Layout(params=sum(shards) * b, optimizer=k * sum(flat) + step_b * len(flat),
                   opt_temp=2 * max(flat) * b if k else 0,
                   full=tuple(p * b for p in padded) if n > 1 else tuple(0 for _ in padded),
                   shard=tuple(s * b for s in shards))


def _gathered(prof: StepProfile, smp: Sample, strategy: str, m_fwd: int, m_bwd: int) -> list[int]:
    """Units unsharded at this sample (unit 0 is the root; units 1.. run in order)."""
    if strategy == "no_shard":
        return []
    last = len(prof.unit_numels) - 1
    unit = prof.segments[smp.segment]
    keep = strategy == "shard_grad_op"  # parameters stay gathered from forward to backward
    if unit == 0:
        before_blocks = smp.segment == 0
        if not smp.backward:
            return [0] + (list(range(1, 1 + min(m_fwd, last))) if before_blocks else list(range(1, last + 1)) if keep else [])
        if before_blocks:  # backward has reached the root's own first layers: every block is done
            return [0]
        return [0] + (list(range(1, last + 1)) if keep else list(range(last, max(0, last - m_bwd), -1)))
    if not smp.backward:
        ahead = list(range(unit + 1, min(last, unit + m_fwd) + 1))
        return [0] + (list(range(1, unit + 1)) if keep else [unit]) + ahead
    behind = list(range(max(1, unit - m_bwd), unit))
    return [0] + (list(range(1, unit + 1)) if keep else [unit] + behind)


def _fsdp_grads(prof: StepProfile, smp: Sample, lay: _Layout) -> tuple[int, int]:
    """(gradient bytes, gradient flats in flight) at a backward sample under FSDP."""
    if not smp.backward:
        return sum(smp.grads), 0
    last = len(prof.unit_numels) - 1
    unit = prof.segments[smp.segment]
    if unit == 0:
        done = list(range(1, last + 1)) if smp.segment == 0 else []
    else:
        done = list(range(unit + 1, last + 1))
    running = smp.grads[unit] + (smp.grads[0] if unit else 0)
    in_flight = lay.full[min(done)] if done and lay.full else 0  # the previous unit's flat, reduce_scatter pending
    return running + sum(lay.shard[u] for u in done), in_flight


def _at_sample(prof: StepProfile, smp: Sample, strategy: str, lay: _Layout, prefetch: tuple[int, int]) -> dict:
    roles = {"parameters": lay.params, "optimizer": lay.optimizer, "activations": smp.activations, "other": smp.other}
    if strategy in FSDP_NAMES:
        grads, flat = _fsdp_grads(prof, smp, lay)
        full = lay.full if lay.full else ()
        gathered = sum(full[u] for u in _gathered(prof, smp, strategy, *prefetch)) if full else 0
        return roles | {"gradients": grads, "buffers": gathered + flat}
    if strategy in ("zero1", "zero2"):  # each gradient is folded into its bucket and freed by its hook
        return roles | {"gradients": 0, "buffers": prof.psi * prof.itemsize if smp.backward else lay.buckets}
    return roles | {"gradients": sum(smp.grads), "buffers": lay.buckets}


def _at_post_backward(prof: StepProfile, smp: Sample, strategy: str, lay: _Layout, prefetch: tuple[int, int]) -> dict:
    """A unit's post_backward: its padded gradient flat is filled while its unsharded grads still live.

    (Just before, the unit's unsharded parameters were freed (reshard comes first) and the previous
    unit's flat was waited on and freed: the new flat takes the parameters' place, one flat in flight.)
    """
    roles = _at_sample(prof, smp, strategy, lay, prefetch)
    unit = prof.segments[smp.segment]
    done = range(unit + 1, len(prof.unit_numels))
    previous = lay.full[unit + 1] if unit + 1 < len(prof.unit_numels) else 0
    return roles | {"buffers": roles["buffers"] - previous,
                    "gradients": smp.grads[unit] + smp.grads[0] + sum(lay.shard[u] for u in done)}


def _at_wait_previous(prof: StepProfile, smp: Sample, strategy: str, lay: _Layout, prefetch: tuple[int, int]) -> dict:
    """A unit's post_backward, waiting for the previous unit's reduce_scatter, on gloo.

    gloo's reduce_scatter all-reduces a clone of its whole input: until the wait, the previous
    unit's padded flat exists twice (the clone is what the ledger sees as "other").
    """
    roles = _at_sample(prof, smp, strategy, lay, prefetch)
    unit = prof.segments[smp.segment]
    previous = lay.full[unit + 1] if unit + 1 < len(prof.unit_numels) else 0
    return roles | {"other": roles["other"] + previous}


def _last_backward_samples(prof: StepProfile) -> list[Sample]:
    """The last backward sample of each non-root unit: the instant before its post_backward."""
    last: dict[int, Sample] = {}
    for smp in prof.samples:
        if smp.backward and prof.segments[smp.segment] != 0:
            last[prof.segments[smp.segment]] = smp
    return list(last.values())


def _at_optimizer(prof: StepProfile, strategy: str, lay: _Layout) -> dict:
    grads = sum(lay.shard) if strategy in FSDP_NAMES else prof.psi * prof.itemsize
    if strategy in ("zero1", "zero2"):  # zero1: the partition's gradient is a view of the buffer
        grads = sum(lay.shard)
    other = 0 if lay.step_buffers else lay.opt_temp  # ZeRO-1 broadcasts after the update's temporaries are gone
    return {"parameters": lay.params, "optimizer": lay.optimizer, "gradients": grads,
            "buffers": lay.buckets + lay.step_buffers, "activations": 0, "other": other}


def estimate_memory(prof: StepProfile | nn.Module, strategy: str, world: int, dtype: torch.dtype | None = None, *,
                    batch=None, loss_fn=None, wrap=None, device: str = "cpu", optimizer: str = "adamw",
                    shard_size: int | None = None, max_inflight_all_gathers: int = DEFAULT_MAX_INFLIGHT_ALL_GATHERS,
                    forward_prefetch: bool = True, backward_prefetch: bool = True,
                    backend: str = "gloo") -> MemoryEstimate:
    """Predicted per-rank peak bytes of one step of `strategy` at `world` ranks (see the module docstring).

    prof: profile_step() of the model with one rank's batch, or the model itself built on the
    meta device (then batch (meta tensors), loss_fn(model, batch) -> loss and wrap (the FSDP
    block types) are needed, and dtype casts it first; profiling once and passing the profile
    is cheaper for many strategies and worlds). shard_size: hybrid_shard's shard group (None =
    world, one node). backend: gloo keeps a copy of each reduce_scatter's input until it is
    waited on; nccl reduces in place.
    """
    if isinstance(prof, nn.Module):
        if batch is None or loss_fn is None:
            raise ValueError("estimate_memory(model, ...) needs batch= (meta tensors of one rank's batch) and "
                             "loss_fn=(model, batch) -> loss, or a StepProfile from profile_step()")
        prof = profile_step(prof.to(dtype) if dtype is not None else prof, batch, loss_fn, wrap, device)
    if strategy not in STAGE:
        raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STAGE)}")
    if optimizer not in OPTIMIZER_STATE_TENSORS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZER_STATE_TENSORS)}")
    lay = _layout(prof, strategy, world, OPTIMIZER_STATE_TENSORS[optimizer] * prof.itemsize, shard_size)
    prefetch = (max_inflight_all_gathers if forward_prefetch else 0,
                max_inflight_all_gathers if backward_prefetch else 0)
    best = MemoryEstimate(strategy, world)
    instants = [("backward" if s.backward else "forward", _at_sample(prof, s, strategy, lay, prefetch))
                for s in prof.samples]
    if strategy in FSDP_NAMES and lay.full and any(lay.full):
        last = _last_backward_samples(prof)
        instants += [("backward", _at_post_backward(prof, s, strategy, lay, prefetch)) for s in last]
        if backend == "gloo" and algorithm_for("gloo") == "native":  # minidist's ring keeps no clone
            instants += [("backward", _at_wait_previous(prof, s, strategy, lay, prefetch)) for s in last]
    instants.append(("optimizer", _at_optimizer(prof, strategy, lay)))
    for where, roles in instants:
        total = sum(roles.values())
        if total > best.total:
            best = MemoryEstimate(strategy, world, total, dict(roles), where)
    return best
