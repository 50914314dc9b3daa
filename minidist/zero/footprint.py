"""ZeRO's memory on one rank, instant by instant (the minidist.footprint interface).

    held(layout, world, stage=1, ...)       the paper's ZeRO-1 / ZeRO-2 (flat_shards.py): list[Held]
    held_broadcast(layout, world, ...)      the owner-broadcast variant (owner_broadcast.py)
    live(optimizer)                         the engine's tensors that exist now, read only

The paper's engine (bucket.py), per bucket b of n_b elements, padded to P_b = N k_b, in
the bytes of its dtypes (p: param_dtype, m: the master dtype, r: reduce_dtype):

    flat_param   P_b p        always: the model's parameters are views of it ("parameters")
    master       k_b m        only under a param_dtype; else a view of flat_param ("optimizer",
                              as ZeRO counts the fp32 master copy in K)
    state        K k_b        the wrapped optimizer's, on the master (4 more bytes a counter)
    grad_flat    P_b r        ZeRO-1: allocated by the first gradient, kept for the run, reduced
                              in place ("buffers"). ZeRO-2: from the bucket's first gradient until
                              its reduce_scatter is reaped ("buffers")
    master.grad  k_b m        ZeRO-1 in its own dtype: a view of grad_flat (nothing); otherwise a
                              tensor of its own from the reduce_scatter's finish to zero_grad

A gradient lives in p.grad only from its accumulation to its hook, which folds it into the
bucket and drops it: the plain model's gradients are never alive together (plain_grads ()).
A bucket's grad_flat is allocated by its first gradient: until the first gradient of the unit
where a bucket begins, that bucket holds nothing (Held.before_grads).

ZeRO-2's buckets in backward: gradients fill the buckets in launch order (the reverse of
registration, so a bucket fills during the backward of the units its parameters belong to);
a full bucket launches its reduce_scatter, and launching the next one reaps those that have
landed (reduce_scatter.py): so while bucket j fills, bucket j-1's buffer may still be alive
(counted: an upper bound when the wire keeps up with backward, the usual case; the engine
allows MAX_INFLIGHT_REDUCTIONS in flight when it does not). After backward only the k_b
shards remain.

The owner-broadcast variant is the all_reduce reducer (minidist.buckets.footprint, DDP's) with optimizer state for
this rank's share only (the rank with the largest share sets the peak). After the update every
share travels from its owner: all N broadcasts are launched at once, into a flat buffer each
(the owner's own: a copy of its parameters; the others: scratch), so p psi of buffers exist
together until the copies back end; then nothing holds them (comm's flight recorder keeps
metadata only).
"""

from __future__ import annotations

import torch

from minidist.buckets import footprint as reducer_footprint
from minidist.buckets.policy import ReducerPolicy
from minidist.footprint import At, Held, OptimizerModel
from minidist.shape import ModelShape
from minidist.zero.partition import partition_by_numel


class _Numel:
    """What partition_by_numel and the bucket rules read of a parameter: its size."""

    def __init__(self, n: int):
        self._n = n

    def numel(self) -> int:
        return self._n


def owner_shares(param_numels, world: int) -> list[list[int]]:
    """The owner-broadcast variant's owners (partition.py): the parameter sizes each rank updates."""
    owner = partition_by_numel([_Numel(x) for x in param_numels], world)
    return [[x for x, r in zip(param_numels, owner) if r == rank] for rank in range(world)]


def _bucket_spans(layout: ModelShape, policy: ReducerPolicy, device_type: str) -> list[tuple[int, int, int]]:
    """(numel, first, last) per bucket in launch order: the instants (reducer_footprint's backward
    positions, larger = earlier) of the bucket's first and last gradient. flat_shards.py builds
    its buckets with the rules of minidist.buckets.policy over the parameters in reverse, as the
    all_reduce reducer does."""
    out = []
    for ids, _ in reducer_footprint.buckets(layout, policy, device_type):
        at = [reducer_footprint.backward_position(layout, i) for i in ids]
        out.append((sum(layout.param_numels[i] for i in ids), max(at), min(at)))
    return out


def held(layout: ModelShape, world: int, *, stage: int = 1, policy: ReducerPolicy = ReducerPolicy(),
         device_type: str = "cpu", optimizer: OptimizerModel = OptimizerModel(), param_itemsize: int | None = None,
         reduce_itemsize: int | None = None) -> list[Held]:
    """The paper's ZeRO-`stage` holdings at every instant of a step (module docstring).

    param_itemsize / reduce_itemsize: a MixedPrecisionPolicy's param_dtype and reduce_dtype sizes
    (None: the parameters' own, layout.itemsize, which is also the master's)."""
    m = layout.itemsize
    p, r = param_itemsize or m, reduce_itemsize or param_itemsize or m
    spans = _bucket_spans(layout, policy, device_type)
    k = [max(1, -(-n // world)) for n, _, _ in spans]
    padded = [world * x for x in k]
    own_grad = [0 if stage == 1 and r == m else x * m for x in k]  # master.grad, once reduced
    base = {"parameters": sum(padded) * p, "optimizer": optimizer.state_bytes(k, m) + (sum(k) * m if p != m else 0)}
    kept = sum(padded) * r if stage == 1 else 0  # ZeRO-1's grad_flat, for the whole run

    def backward(pos: int, early: bool = False) -> dict[str, int]:
        """At backward position pos; early: before that position's first gradient (its buckets not begun)."""
        started = [j for j, (_, first, _) in enumerate(spans) if first > pos or first == pos and not early]
        launched = [j for j in started if spans[j][2] > pos]  # full before this instant
        if stage == 1:
            return base | {"buffers": kept, "gradients": sum(own_grad[j] for j in launched)}
        filling = [j for j in started if j not in launched]
        alive = filling + launched[-1:]  # the last launched is reaped at the next launch
        return base | {"buffers": sum(padded[j] for j in alive) * r,
                       "gradients": sum(k[j] * r for j in launched)}

    rows = [Held(At("forward"), base | {"buffers": kept}, (), "forward")]
    for u in range(layout.units):
        for st in ((0, 1) if u == 0 else (0,)):
            pos = reducer_footprint.position_of(layout, u, st)
            rows.append(Held(At("backward", u, st), backward(pos), (), "backward",
                             before_grads=backward(pos, early=True)))
    grads = sum(own_grad) if stage == 1 else sum(k) * m
    rows.append(Held(At("optimizer"), base | {"buffers": kept, "gradients": grads,
                                              "other": optimizer.temporaries(k, m)}, (), "optimizer step"))
    return rows


def held_broadcast(layout: ModelShape, world: int, *, policy: ReducerPolicy = ReducerPolicy(),
                   device_type: str = "cpu", optimizer: OptimizerModel = OptimizerModel(),
                   backend: str = "gloo") -> list[Held]:
    """The owner-broadcast variant's holdings at every instant (module docstring)."""
    mine = max(owner_shares(layout.param_numels, world), key=sum)
    rows = reducer_footprint.held(layout, world, policy=policy, device_type=device_type, optimizer=optimizer,
                                  optimizer_pieces=mine, backend=backend)
    if world == 1:
        return rows
    last = rows[-1]  # the update; then the broadcasts, its temporaries gone
    flats = last.bytes["buffers"] + layout.psi * layout.itemsize
    return rows + [Held(At("optimizer", stage=1), last.bytes | {"buffers": flats, "other": 0}, (),
                        "after the update: every share's broadcast buffer")]


def live(optimizer) -> dict[str, list[torch.Tensor]]:
    """A ShardedOptimizer's tensors that exist now, read without allocating (empty for another optimizer)."""
    engine = getattr(optimizer, "engine", None)
    if engine is None:
        return {}
    if not hasattr(engine, "buckets"):  # the owner-broadcast variant: DDP's reducer
        reducer = engine.reducer
        return {"buffers": [b._flat for b in reducer.buckets if b._flat is not None]} if reducer else {}
    out: dict[str, list[torch.Tensor]] = {"parameters": [], "gradients": [], "buffers": [], "optimizer": []}
    for b in engine.buckets:
        out["parameters"].append(b.flat_param)  # padding included; the model's parameters are views of it
        if not b.master_is_param:
            out["optimizer"].append(b.master)
        if b.grad_flat is not None:
            out["buffers"].append(b.grad_flat)
        if b.master.grad is not None:
            out["gradients"].append(b.master.grad)
    return out
