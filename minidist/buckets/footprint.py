"""The all_reduce reducer's memory on one rank, instant by instant (the minidist.footprint interface).

    held(layout, world, policy=ReducerPolicy(), device_type="cpu")   # from sizes: list[Held]
    live(reducer)                                                    # its buffers that exist now

Over a replicated model (DDP, and ZeRO's owner-broadcast variant): every rank holds all psi
parameters (p bytes each), all their gradients (p.grad, as the plain model has them) and the
optimizer's state (for all of them; ZeRO's variant: this rank's share). What the reducer adds
depends on how each bucket travels (reduction.py decides, and this module asks it the same
question):

  * in place (the default on the CPU): nothing. p.grad itself is divided and all_reduced.
  * through the bucket's flat buffer (accelerators, registered comm hooks,
    gradient_as_bucket_view, packed parts of IN_PLACE_MAX_BYTES or more): the buffer is
    allocated at the first backward and kept for the run, one more copy of those gradients;
    with gradient_as_bucket_view p.grad *is* a view of it, so the gradients live there.

One more holder, outside the reducer, counted as "other": gloo packs a coalesced all_reduce
into one flat buffer on its worker (the packed part of a bucket reduced in place) while it
runs: from the bucket's launch, counted to the end of the backward (an upper bound: it may
finish sooner). Nothing outlives the step: each bucket's future is dropped when waited on, and
comm's flight recorder keeps metadata only, so zero_grad() frees the gradients whenever it runs.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from minidist.buckets import reduction
from minidist.buckets.policy import ReducerPolicy, assign_buckets
from minidist.footprint import At, Held, OptimizerModel
from minidist.shape import ModelShape

_DTYPES = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


class _Spec:
    """What the reducer's rules read of a parameter: its size, dtype and device."""

    def __init__(self, numel: int, itemsize: int, device_type: str):
        self._numel, self._itemsize = numel, itemsize
        self.dtype, self.device = _DTYPES[itemsize], torch.device(device_type)

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return self._itemsize

    def is_contiguous(self) -> bool:
        return True


def buckets(layout: ModelShape, policy: ReducerPolicy, device_type: str,
            hook=reduction.allreduce_presummed) -> list[tuple[list[int], bool]]:
    """(indices into layout.param_numels, reduced in place?) per bucket, as the reducer builds them.

    In reverse registration order, the reducer's order until its one rebuild in the order
    gradients became ready (for a network whose backward runs its layers in reverse, the same).
    """
    order = list(reversed(range(len(layout.param_numels))))
    specs = [_Spec(layout.param_numels[i], layout.itemsize, device_type) for i in order]
    out = []
    for members in assign_buckets(specs, policy.bucket_cap_bytes, policy.first_bucket_bytes, policy.last_bucket_bytes):
        bucket = SimpleNamespace(params=[specs[k] for k in members], dtype=specs[members[0]].dtype)
        out.append(([order[k] for k in members], reduction.reduces_in_place(hook, policy, bucket)))
    return out


def backward_position(layout: ModelShape, i: int) -> int:
    """When parameter i's gradient is ready, as a position that falls while backward runs: a root
    parameter registered after every block's (the final norm, the head) comes first (layout.units),
    block u's at u, a root parameter registered before them (the embedding) last (0)."""
    last_block = max((j for j, u in enumerate(layout.param_units) if u), default=-1)
    u = layout.param_units[i]
    return layout.units if u == 0 and i > last_block else u


def position_of(layout: ModelShape, unit: int, stage: int) -> int:
    """The backward position (backward_position) of the instant At("backward", unit, stage)."""
    if unit:
        return unit
    return layout.units if stage == 0 else 0


def _fills_in(layout: ModelShape, ids: list[int]) -> int:
    """The unit during whose backward a bucket fills; 0: at the very end (a root parameter whose
    gradient comes last, as the embedding's)."""
    return min(backward_position(layout, i) for i in ids)


def held(layout: ModelShape, world: int, *, policy: ReducerPolicy = ReducerPolicy(), device_type: str = "cpu",
         optimizer: OptimizerModel = OptimizerModel(), optimizer_pieces: list[int] | None = None,
         hook=reduction.allreduce_presummed, backend: str = "gloo", reducer: bool = True) -> list[Held]:
    """The holdings of a replicated model under the reducer at every instant of a step (module docstring).
    optimizer_pieces: the elements of each tensor this rank's optimizer updates (default every
    parameter; ZeRO's owner-broadcast variant passes its share); reducer=False: the plain model (no
    DDP), for comparison."""
    p, psi = layout.itemsize, layout.psi
    pieces = list(layout.param_numels) if optimizer_pieces is None else optimizer_pieces
    plan = buckets(layout, policy, device_type, hook) if reducer else []
    nbytes = lambda ids: sum(layout.param_numels[i] for i in ids) * p  # noqa: E731
    flats = sum(nbytes(ids) for ids, in_place in plan if not in_place)
    packed = [(_fills_in(layout, ids), sum(layout.param_numels[i] * p for i in ids
                                          if layout.param_numels[i] * p < reduction.SEPARATE_MIN_BYTES))
              for ids, in_place in plan if in_place and backend == "gloo"]
    as_view = policy.gradient_as_bucket_view and world > 1
    base = {"parameters": psi * p, "optimizer": optimizer.state_bytes(pieces, p), "buffers": flats}
    grads = () if as_view else None  # as bucket views, the gradients are the flat buffers
    rows = [Held(At("forward"), base | {"other": 0}, grads, "forward")]
    for u in range(layout.units):
        for stage in ((0, 1) if u == 0 else (0,)):
            staged = sum(b for at, b in packed if at != 0 and (u == 0 and stage == 1 or 0 < u <= at))
            note = " (gloo packing launched buckets)" if staged else ""
            rows.append(Held(At("backward", u, stage), base | {"other": staged}, grads, "backward" + note))
    rows.append(Held(At("optimizer"), base | {"gradients": 0 if as_view else psi * p,
                                              "other": optimizer.temporaries(pieces, p)}, (), "optimizer step"))
    return rows


def live(reducer) -> dict[str, list[torch.Tensor]]:
    """A Reducer's flat buffers that exist now (a bucket reduced in place never allocates one)."""
    return {"buffers": [b._flat for b in reducer.buckets if b._flat is not None]}
