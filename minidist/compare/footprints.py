"""Today's ZeRO-1 and FSDP memory by instant (the minidist.footprint interface), written from outside.

    zero1_held(layout, world, policy, device_type, optimizer)     fsdp_held(layout, strategy, world, ...)
    zero1_live(model, optimizer)                                   fsdp_live(model)

These belong in minidist/zero and minidist/fsdp (as minidist/ddp/footprint.py is in DDP's):
their owners move them there and keep them true when a schedule changes; until then they
describe the engines as they are on main. tests/compare/test_measure.py compares the
estimates built from them with torch's allocator events, so a stale one fails there.

ZeRO-1 (minidist.zero.ShardedOptimizer over DDP): DDP's holdings (minidist.ddp.footprint), with
optimizer state for this rank's share only (the rank with the largest share sets the peak).
After the update, every share travels from its owner: all N broadcasts are launched at once,
into a flat buffer each (the owner's own: a copy of its parameters; the others: scratch), so
p psi of buffers exist together until the copies back end. Their futures hold those buffers
until this rank's next collective (comm.flight_recorder, see the DDP footprint): through the
next forward, in "other" (an upper bound).

FSDP (minidist.fsdp, one flat parameter per unit): per unit u of padded size P_u (a multiple of
the shard group's n ranks), this rank keeps the shard P_u / n (parameters, optimizer state on
its pieces, the reduced gradient shard). Unsharded, a unit's `full` buffer (P_u) is allocated
for the forward and again for the backward (full_shard), or from its forward to the end of its
backward (shard_grad_op); the root encloses every unit and the unit that ends the forward (the
root) stays gathered into the backward; prefetch keeps max_inflight more units gathered ahead.
At a unit's post_backward its `full` is freed first, then the previous unit's reduce_scatter is
waited on (its P_u input freed; gloo's own reduce_scatter also held a clone of it), then the
flat gradient (P_u) is filled from the unit's gradients, which are dropped. no_shard gathers
nothing: the flat gradient is all-reduced and kept as the gradient. On gloo an all_gather into
one tensor runs into a flat copy of the output (P_u, on gloo's worker) and copies it back, so
while a prefetched unit's gather may still run ("other", an upper bound) that copy exists too.

And FlatParamShard keeps every original parameter alive (ParamInfo.param in `flat.infos`): p psi
per rank for the whole run, on top of the shards; counted here as "other" until fixed.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.comm.ring import algorithm_for
from minidist.ddp import footprint as ddp_footprint
from minidist.ddp.bucket import ReducerPolicy
from minidist.footprint import At, Held, ModelLayout, OptimizerModel
from minidist.zero.partition import partition_by_numel

FSDP_STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")


class _Numel:
    """What partition_by_numel reads of a parameter."""

    def __init__(self, n: int):
        self._n = n

    def numel(self) -> int:
        return self._n


def zero1_shares(param_numels, world: int) -> list[list[int]]:
    """ZeRO-1's owners (minidist.zero.partition): the parameter sizes each of the ranks updates."""
    owner = partition_by_numel([_Numel(x) for x in param_numels], world)
    return [[x for x, r in zip(param_numels, owner) if r == rank] for rank in range(world)]


def zero1_held(layout: ModelLayout, world: int, *, policy: ReducerPolicy = ReducerPolicy(), device_type: str = "cpu",
               optimizer: OptimizerModel = OptimizerModel(), backend: str = "gloo") -> list[Held]:
    mine = max(zero1_shares(layout.param_numels, world), key=sum)
    rows = ddp_footprint.held(layout, world, policy=policy, device_type=device_type, optimizer=optimizer,
                              optimizer_pieces=mine, backend=backend)
    if world == 1:
        return rows
    flats = layout.psi * layout.itemsize
    out = []
    for h in rows:
        if h.at.phase in ("forward", "backward") and h.bytes.get("other"):
            h = Held(h.at, h.bytes | {"other": flats}, h.plain_grads, h.note.replace("gradients", "broadcast buffers"))
        out.append(h)
    last = rows[-1]  # the update; then the broadcasts, its temporaries gone
    out.append(Held(At("optimizer", stage=1), last.bytes | {"buffers": last.bytes["buffers"] + flats, "other": 0},
                    (), "after the update: every share's broadcast buffer"))
    return out


def _shard_pieces(numels, shard: int, rank: int = 0) -> list[int]:
    """Elements of each parameter inside `rank`'s shard of a unit's flat buffer."""
    lo, hi, out, offset = rank * shard, (rank + 1) * shard, [], 0
    for n in numels:
        out.append(max(0, min(offset + n, hi) - max(offset, lo)))
        offset += n
    return out


def _gathered(strategy: str, at: At, last: int, m_fwd: int, m_bwd: int) -> tuple[list[int], list[int]]:
    """(units whose `full` is allocated at `at`, those of them prefetched: their all_gather may still run).

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


def fsdp_held(layout: ModelLayout, strategy: str, world: int, *, shard_size: int | None = None,
              optimizer: OptimizerModel = OptimizerModel(), max_inflight_all_gathers: int = 1,
              forward_prefetch: bool = True, backward_prefetch: bool = True, backend: str = "gloo",
              device_type: str = "cpu") -> list[Held]:
    """FSDP's holdings at every instant (module docstring); rank 0, which holds the most padding-free state."""
    p, last = layout.itemsize, layout.units - 1
    n = 1 if strategy == "no_shard" else (shard_size or world) if strategy == "hybrid_shard" else world
    padded = [-(-sum(u) // n) * n for u in layout.unit_param_numels]
    shard = [x // n for x in padded]
    pieces = [x for u, s in zip(layout.unit_param_numels, shard) for x in _shard_pieces(u, s)]
    full = [x * p if n > 1 else 0 for x in padded]  # no_shard: `full` is the shard itself
    flat_in_flight = full  # the reduce_scatter input: padded; no_shard: the flat is the gradient
    m = (max_inflight_all_gathers if forward_prefetch else 0, max_inflight_all_gathers if backward_prefetch else 0)
    base = {"parameters": sum(shard) * p, "optimizer": optimizer.state_bytes(pieces, p), "other": layout.psi * p}
    clone = n > 1 and backend == "gloo" and algorithm_for(backend, device_type) == "native"
    staging = n > 1 and backend == "gloo"  # gloo's all_gather fills a flat copy of the output, then copies it
    shards = lambda units: sum(shard[v] * p for v in units)  # noqa: E731 - reduced gradient shards
    rows = []
    def gathered(at: At, skip: int | None = None) -> dict[str, int]:
        units, in_flight = _gathered(strategy, at, last, *m)
        return {"buffers": sum(full[v] for v in units if v != skip),
                "other": base["other"] + (sum(full[v] for v in in_flight) if staging else 0)}

    for u in range(layout.units):
        for stage in ((0, 1) if u == 0 else (0,)):
            at = At("forward", u, stage)
            rows.append(Held(at, base | gathered(at), None, f"forward of unit {u}"))
    for u in range(layout.units):
        for stage in ((0, 1) if u == 0 else (0,)):
            at = At("backward", u, stage)
            done = list(range(1, last + 1)) if u == 0 and stage == 1 else list(range(u + 1, last + 1)) if u else []
            g = gathered(at)
            rows.append(Held(at, base | g | {"buffers": g["buffers"] + (flat_in_flight[min(done)] if done else 0),
                                             "gradients": shards(done)},
                             (u, 0) if u else (0,), f"backward of unit {u}"))
        if u == 0:
            continue
        done = list(range(u + 1, last + 1))
        gathered_u = gathered(At("backward", u), skip=u)["buffers"]
        previous = flat_in_flight[u + 1] if u < last else 0
        if clone and previous:  # freed `full`, waiting for the previous reduce_scatter: its input twice
            rows.append(Held(At("post_backward", u, 0), base | {"buffers": gathered_u + previous, "other":
                             base["other"] + previous, "gradients": shards(done)}, (u, 0),
                             f"unit {u}'s post_backward, gloo's reduce_scatter clone alive"))
        flat = {"buffers": gathered_u + padded[u] * p, "gradients": shards(done)} if n > 1 else \
            {"buffers": gathered_u, "gradients": shards(done) + padded[u] * p}  # no_shard: the flat is the gradient
        rows.append(Held(At("post_backward", u, 1), base | flat, (u, 0), f"unit {u}'s post_backward, its flat gradient filled"))
    rows.append(Held(At("optimizer"), base | {"gradients": sum(shard) * p, "other": base["other"] +
                                              optimizer.temporaries(pieces, p)}, (), "optimizer step"))
    return rows


def zero1_live(model: nn.Module, optimizer) -> dict[str, list[torch.Tensor]]:
    return ddp_footprint.live(model)


def fsdp_live(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """The FSDP units' tensors that exist now, read without allocating."""
    out: dict[str, list[torch.Tensor]] = {"parameters": [], "gradients": [], "buffers": [], "other": []}
    for unit in model.units:
        flat = unit.flat
        out["parameters"].append(flat.local_shard)  # while unsharded, model.parameters() are views of `full`
        out["gradients"] += [q.grad for q in flat.sharded_params + flat.unsharded_params]
        if not flat.aliased:
            out["buffers"].append(flat.full)
        if unit.reduction is not None:
            flat_grad, shard_grad = unit.reduction.buffers  # no_shard: no separate input
            out["buffers"].append(flat_grad)
            out["gradients"].append(shard_grad)
        out["other"] += [info.param for info in flat.infos]  # the originals, kept alive (module docstring)
    return out
