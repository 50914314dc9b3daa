"""The planner's peak memory per GPU: the most of three instants of a step, by role.

The record's model states (ZeRO's (p + g + K) psi family at the run's precision), its engine's
buffers instant by instant (the record's held(), minidist.footprint), activations by formula
(minidist.memory.activations), and a pipeline stage's first gradient and boundary tensors; checked
against torch's allocator at 4 processes in tests/compare/test_plan.py.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from minidist.compare.hardware import Hardware
from minidist.compare.plan_layout import GPTModel, Layout, engine
from minidist.footprint import OptimizerModel
from minidist.memory.activations import GPTShape, Parallelism, activation_bytes
from minidist.precision import RunPrecision

ROLES = ("parameters", "gradients", "optimizer", "buffers", "activations")


def memory(model: GPTModel, lay: Layout, seq: int, precision: RunPrecision | str, hw: Hardware = Hardware(),
           device: str = "cuda", optimizer: str = "adamw") -> dict[str, float]:
    """Peak bytes per GPU by role (ROLES, and "total", "where", "in_flight"): the most of three instants.

    backward's start   states (no gradients yet) + the engine's holdings before its first gradient
                       + every activation + the loss's fp32 gradient (b s V / t); a pipeline stage's first
                       gradient and its boundary tensors instead (_backward_start)
    after the head     the engine's first bucket allocated, the head's and loss's saved tensors freed
    optimizer          states + gradients + the engine's buffers and the optimizer's temporaries
    States: the record's (p, g, K of the precision) over its state group; the engine's transient
    holdings from its footprint (held()) at the compute dtype; activations minidist.memory's formula.
    in_flight: of the total, a backend's staging of a collective that may have landed before that
    instant (Held.in_flight): a measured peak is the total, or the total less it."""
    p = RunPrecision(precision) if isinstance(precision, str) else precision
    e = p.compute_bytes
    states, rows, plain_grads = _holdings(model, replace(lay, micro_batch=0, recompute="none"), seq, p, hw,
                                          optimizer, device)
    sp = vp = lay.tp > 1 and lay.sequence_parallel
    acts = activation_bytes(GPTShape(lay.micro_batch, seq, model.hidden, model.heads, model.layers, model.vocab), p,
                            Parallelism(lay.tp, sp, vp, lay.recompute, lay.pp, lay.cp))
    first_grad, boundary = _backward_start(model, lay, seq, e, acts)

    def held_bytes(h, before: bool) -> dict[str, float]:
        b = dict(h.before_grads if before and h.before_grads is not None else h.bytes)
        return {"gradients": b.get("gradients", 0), "buffers": b.get("buffers", 0) + b.get("other", 0) + boundary}

    base = {"parameters": states["parameters"], "optimizer": states["optimizer"]}
    backward = [h for h in rows if h.at.phase == "backward"] or rows
    first = backward[0]
    during = max(backward, key=lambda h: sum(held_bytes(h, False).values()))
    instants = [("backward's start", base | held_bytes(first, True) | {"activations": acts.total + first_grad},
                 first.in_flight),
                ("after the head's backward", base | held_bytes(during, False)
                 | {"activations": acts.total - acts.head + first_grad + acts.recompute_transient}, during.in_flight)]
    for h, grads in plain_grads:  # (boundary: pp's freed by then)
        roles = held_bytes(h, False)
        roles["gradients"] += grads
        instants.append((h.note or h.at.phase, base | roles | {"activations": 0.0}, h.in_flight))
    where, roles, in_flight = max(instants, key=lambda kv: sum(kv[1].values()))
    return roles | {"total": sum(roles.values()), "where": where, "in_flight": in_flight}


@lru_cache(maxsize=4096)
def _holdings(model: GPTModel, lay: Layout, seq: int, p: RunPrecision, hw: Hardware, optimizer: str, device: str):
    """(the model states by role, the engine's held() rows, and each post-backward or optimizer row with its
    gradients' bytes) of an engine layout (`lay` without its micro-batch and recompute, which change none of
    them). A plan asks memory() for every micro-batch and recompute of each layout: for the docs' 7.5B GPT on 64
    GPUs, 4,050 calls for 365 distinct engine layouts."""
    record, cfg, world, group, shape = engine(model, lay, seq, p, hw)
    e = p.compute_bytes
    states = record.model_state_bytes(shape.psi, group, e, e, p.optimizer_bytes)
    rows = tuple(record.held(shape, cfg, world, group, optimizer=OptimizerModel(optimizer, device),
                             backend="nccl" if device == "cuda" else "gloo", device_type=device))
    numels = shape.unit_numels
    plain_grads = tuple((h, shape.psi * e if h.plain_grads is None else sum(numels[u] for u in h.plain_grads) * e)
                        for h in rows if h.at.phase in ("post_backward", "optimizer"))
    return states, rows, plain_grads


def _backward_start(model: GPTModel, lay: Layout, seq: int, e: int, acts) -> tuple[float, float]:
    """(the first gradient a backward allocates, a pipeline stage's boundary tensors) in bytes. The last stage (and
    a model without pp) starts with the loss's fp32 gradient of the logits, b s V / t, and holds the activation it
    received and the gradient it sends (2 b s h e); a first stage binding the peak (1F1B: p micro-batches in flight,
    acts.head = 0) starts inside the last block's MLP (its 4h-wide gradient, the one arriving and the one leaving)
    and holds each in-flight micro-batch's output, which its backward starts from, and the gradient received."""
    sp = lay.tp > 1 and lay.sequence_parallel
    tokens = lay.micro_batch * seq // lay.cp
    loss_grad = tokens * model.vocab / (lay.tp if sp else 1) * 4
    boundary = tokens * model.hidden * e / (lay.tp if sp else 1)  # b s h e: one activation between stages
    if lay.pp == 1:
        return loss_grad, 0.0
    if acts.head == 0:
        return tokens * 4 * model.hidden * e / lay.tp + 2 * boundary, (lay.pp + 1) * boundary
    return loss_grad, 2 * boundary
