"""FSDP's memory on one rank, instant by instant (the minidist.footprint interface).

    held(layout, strategy, world, ...)    from sizes and settings: list[Held]
    live(model)                           the units' tensors that exist now, read only

Per unit u, each parameter of R rows and C elements per row is split as shard_spec.py says:
c = ceil(R / n) rows per rank (n = the shard group), so this rank's padded shard is
S_u = sum of c C over the unit's parameters, and the unit unsharded is P_u = n S_u (param.py):

    local        S_u, master dtype     always ("parameters"); the sharded parameters are views of
                                       it, the optimizer's state is shaped like their rows
    full         P_u, param_dtype      from its all_gather's start (prefetch: up to `prefetch`
                                       units ahead of use; the gather lands in it, all_gather.py)
                                       to reshard: full_shard frees it after forward (except the
                                       unit that ends the forward, the root) and gathers again in
                                       backward; shard_grad_op keeps it from forward to its
                                       post_backward
    reduce input P_u, reduce dtype     the unit's gradients themselves (padded where N does not
                                       divide a parameter's rows), from its post_backward until
                                       its reduce_scatter has landed (polled at every gradient
                                       after, waited at the next post_backward): at most this
                                       one and the one being computed
    reduce out   S_u                   the averaged rows, then the sharded parameters' .grad
                                       (views) until zero_grad ("gradients")

A prefetched unit holds its `full` from the gather's start, as a running one does, so each
instant counts P_u per unit gathered or gathering (`prefetch` units ahead,
forward and backward: the default schedule's one, or prefetch_ahead's lists). At a unit's post_backward its `full` is freed first, then the previous
unit's reduce_scatter is waited on (its gradients dropped), then the unit's own gradients
become the next reduction's input, without a copy (reduce_scatter.py). no_shard gathers
nothing: the whole gradient (the unit's gradients end to end, a copy of them for that
moment) is all-reduced and kept as the gradient.

gloo's coalesced all_gather copies the inputs into one flat buffer (S_u) and gathers into
another (P_u) on its worker thread, which frees both once the pieces are in place (gloo runs
the work under the caller's profiling state, so torch's allocator events see them; MemTracker
does not). A unit whose gather may still be running at an instant counts them ("other", and
Held.in_flight): an upper bound, since a measured peak holds them only if the gather has not
landed by then (at 4 processes on 2 cores it has, in about one step in four). gloo's own
reduce_scatter all-reduces a clone of its input, which comm.reduce_scatter_coalesced first
copies rank-major (not minidist's ring, the default on gloo: minidist.comm.ring): two copies
of the gradients beside them, while it runs. Rank 0 holds the most: every rank's shard is
padded to c rows, and rank 0's are all real rows (its optimizer state is the largest).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.comm.ring import algorithm_for
from minidist.footprint import At, Held, OptimizerModel
from minidist.shape import ModelShape

STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")


def _gathered(strategy: str, at: At, last: int, m_fwd: int, m_bwd: int) -> tuple[list[int], list[int]]:
    """(units holding P_u at `at`: `full` or a gather's output, those of them gathered ahead of use).

    0 = root, 1..last the blocks in forward order; the root's stage 1 = after the blocks (in this
    phase's order)."""
    keep = strategy == "shard_grad_op"  # parameters stay gathered from forward to backward
    u, after = at.unit, at.stage == 1
    if at.phase == "forward":
        if u == 0:
            ahead = [] if after else list(range(1, 1 + min(m_fwd, last)))
            return [0] + (list(range(1, last + 1)) if keep and after else ahead), ahead
        ahead = list(range(u + 1, min(last, u + m_fwd) + 1))
        return [0] + (list(range(1, u + 1)) if keep else [u]) + ahead, ahead
    if u == 0:
        if after:
            return [0], []
        behind = [] if keep else list(range(last, max(0, last - m_bwd), -1))
        return [0] + (list(range(1, last + 1)) if keep else behind), behind
    behind = [] if keep else list(range(max(1, u - m_bwd), u))
    return [0] + (list(range(1, u + 1)) if keep else [u] + behind), behind


def held(layout: ModelShape, strategy: str, world: int, *, shard_size: int | None = None,
         optimizer: OptimizerModel = OptimizerModel(), prefetch: int = 1, backend: str = "gloo",
         device_type: str = "cpu", param_itemsize: int | None = None,
         reduce_itemsize: int | None = None) -> list[Held]:
    """FSDP's holdings at every instant (module docstring), on rank 0.

    param_itemsize / reduce_itemsize: the policy's param_dtype and reduce_dtype sizes (None:
    the parameters' own; reduce_dtype defaults to param_dtype, as FSDP's)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown FSDP strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    m, last = layout.itemsize, layout.units - 1
    p = param_itemsize or m
    r = reduce_itemsize or p
    n = 1 if strategy == "no_shard" else (shard_size or world) if strategy == "hybrid_shard" else world
    pieces = [[-(-rows // n) * cols for rows, cols in layout.rows(u)] for u in range(layout.units)]
    local = [sum(ps) for ps in pieces]
    aliased = n == 1 and p == m  # `full` is `local` itself: nothing gathered
    full = [0 if aliased else n * s * p for s in local]
    reduce_in = [n * s * r if n > 1 else 0 for s in local]  # no_shard: the input is the gradient itself
    m_ahead = (prefetch, prefetch)
    base = {"parameters": sum(local) * m, "optimizer": optimizer.state_bytes([x for ps in pieces for x in ps], m),
            "other": 0}
    clone = n > 1 and backend == "gloo" and algorithm_for(backend, device_type) == "native"
    staging = n > 1 and backend == "gloo"  # gloo's all_gather: flat copies of the inputs and of the output
    shards = lambda units: sum(local[v] * r for v in units)  # noqa: E731 - reduced rows, in the reduce dtype

    def gathered(at: At, skip: int | None = None) -> dict[str, int]:
        units, in_flight = _gathered(strategy, at, last, *m_ahead)
        return {"buffers": sum(full[v] for v in units if v != skip),
                "other": sum(full[v] + local[v] * p for v in in_flight) if staging else 0}

    rows = []
    for u in range(layout.units):
        for stage in ((0, 1) if u == 0 else (0,)):
            at = At("forward", u, stage)
            g = gathered(at)
            rows.append(Held(at, base | g, None, f"forward of unit {u}", in_flight=g["other"]))
    for u in range(layout.units):
        for stage in ((0, 1) if u == 0 else (0,)):
            at = At("backward", u, stage)
            done = list(range(1, last + 1)) if u == 0 and stage == 1 else list(range(u + 1, last + 1)) if u else []
            g = gathered(at)
            rows.append(Held(at, base | g | {"buffers": g["buffers"] + (reduce_in[min(done)] if done else 0),
                                             "gradients": shards(done)},
                             (u, 0) if u else (0,), f"backward of unit {u}", in_flight=g["other"]))
        if u == 0:
            continue
        done = list(range(u + 1, last + 1))
        gathered_u = gathered(At("backward", u), skip=u)["buffers"]
        previous = reduce_in[u + 1] if u < last else 0
        if clone and previous:  # freed `full`, waiting for the previous reduce_scatter: its input thrice
            rows.append(Held(At("post_backward", u, 0), base | {"buffers": gathered_u + previous, "other": 2 * previous,
                                                                "gradients": shards(done)}, (u, 0),
                             f"unit {u}'s post_backward, gloo's reduce_scatter clone alive", in_flight=2 * previous))
        filled = {"buffers": gathered_u + reduce_in[u], "gradients": shards(done)} if n > 1 else \
            {"buffers": gathered_u, "gradients": shards(done) + local[u] * r}  # no_shard: the input is the gradient
        rows.append(Held(At("post_backward", u, 1), base | filled, (0,) if n > 1 else (u, 0),
                         f"unit {u}'s post_backward, its gradients handed to the reduction"))
    rows.append(Held(At("optimizer"), base | {"gradients": sum(local) * m, "other": optimizer.temporaries(
        [x for ps in pieces for x in ps], m)}, (), "optimizer step"))
    return rows


def live(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """The FSDP units' tensors that exist now, read without allocating."""
    out: dict[str, list[torch.Tensor]] = {"parameters": [], "gradients": [], "buffers": []}
    for unit in getattr(model, "units", ()):
        shards = unit.shards
        out["parameters"].append(shards.local)  # while unsharded, model.parameters() are views of `full`
        out["gradients"] += [fp.sharded.grad for fp in shards.params] + [fp.unsharded.grad for fp in shards.params]
        if not shards.aliased:
            out["buffers"].append(shards.full)
        if unit.all_gather is not None:  # in flight: a cast copy of `local`, if any (`full` is counted above)
            out["buffers"] += unit.all_gather.buffers
        if unit.reduction is not None:
            grad_inputs, shard_grad = unit.reduction.buffers  # no_shard: no separate input
            out["buffers"] += grad_inputs
            out["gradients"] += [shard_grad] if shard_grad is not None else []
    return out
