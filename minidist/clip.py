"""One global-norm clip for any placement: the norm of the whole model's gradient from the pieces each rank holds.

    total = clip_grad_norm_(pieces, max_norm, layout)           # the trainer: a Layout reduces over any dims
    total = clip_grad_norm_(pieces, max_norm, NamedGroups(...))  # an engine: over the groups it knows

`pieces`: (parameter, its gradient on this rank or None) for every parameter this rank holds
a piece of: FSDP's sharded parameters, ZeRO's shards of its buckets (each beside the
parameter it belongs to), a plain model's parameters. Each parameter carries its
declaration (minidist.sharding): the mesh dimensions that split it (FSDP's rows over its
shard dimension, a tensor-parallel slice over "tp"); `also` adds dimensions that split
every piece (ZeRO's flat shards: its data-parallel dimension).

How the norm is summed. Group the gradients by the dimensions that split their parameter;
a group's local sum of |g|^p is all_reduced over exactly those dimensions (max for the
inf-norm), so each element of the full gradient is counted once: a shard is added to the
other shards, a replica is not added to its copies. Then every gradient is scaled by
min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ does. Cost: one scalar
all_reduce per group and dimension (one, for a single engine); the pieces' norms are read
where they live (CPU offload: the host), the scalar travels to the reduction's device.

Every rank must pass every parameter (with or without a gradient), so that all ranks form
the same groups and issue the same collectives.
"""

from __future__ import annotations

import math
from typing import Iterable, Protocol

import torch
import torch.distributed as dist

from minidist import comm
from minidist.sharding import sharded_over

Dims = tuple[str, ...]


class Reducer(Protocol):
    """What the clip asks of the ranks: sum (or max) a tensor over named mesh dimensions, in place.
    minidist.mesh.Layout is one; NamedGroups (below) is an engine's."""

    def all_reduce(self, tensor: torch.Tensor, over: Dims, op) -> torch.Tensor: ...


class NamedGroups:
    """An engine's own groups by mesh dimension name, for a clip that needs no more (its parameters are
    split over these dimensions only; anything else is refused in one line naming `fallback`)."""

    def __init__(self, groups: dict[str, dist.ProcessGroup | None], who: str, fallback: str):
        self.groups, self.who, self.fallback = groups, who, fallback

    def all_reduce(self, tensor: torch.Tensor, over: Dims, op) -> torch.Tensor:
        unknown = sorted(set(over) - set(self.groups))
        if unknown:
            mine = ", ".join(repr(d) for d in sorted(self.groups)) or "no mesh dimension"
            raise ValueError(f"{self.who} sums over {mine} only, but some parameters are also split "
                             f"over {unknown}: use {self.fallback}")
        for dim in over:
            if dist.get_world_size(self.groups[dim]) > 1:
                comm.all_reduce(tensor, op, group=self.groups[dim])
        return tensor


def dims_of(param: torch.Tensor, also: Dims = ()) -> Dims:
    """The mesh dimensions that split `param` (and `also`), sorted: the key of its group for a norm."""
    return tuple(sorted(set(sharded_over(param)) | set(also)))


def norm_groups(pieces: Iterable[tuple[torch.Tensor, torch.Tensor | None]], also: Dims = ()) -> dict[Dims, list]:
    """{dimensions that split a parameter: the gradients of its pieces}, a key for every parameter given."""
    groups: dict[Dims, list[torch.Tensor]] = {}
    for param, grad in pieces:
        grads = groups.setdefault(dims_of(param, also), [])
        if grad is not None:
            grads.append(grad)
    return groups


@torch.no_grad()
def global_norm(groups: dict[Dims, list[torch.Tensor]], reducer: Reducer, device: torch.device,
                norm_type: float = 2.0) -> torch.Tensor:
    """The norm of the whole gradient (module docstring), a float32 scalar on `device`, the same on every rank."""
    inf = math.isinf(norm_type)
    total = torch.zeros((), dtype=torch.float32, device=device)
    for dims in sorted(groups):
        part = torch.nn.utils.get_total_norm(groups[dims], norm_type).to(device, torch.float32)
        part = part if inf else part ** norm_type
        reducer.all_reduce(part, dims, comm.ReduceOp.MAX if inf else comm.ReduceOp.SUM)
        total = torch.maximum(total, part) if inf else total + part
    return total if inf else total ** (1.0 / norm_type)


@torch.no_grad()
def scale_(grads: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Multiply every gradient by min(1, max_norm / (total + 1e-6)), in place, where each lives."""
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    by_place: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        by_place.setdefault((g.device, g.dtype), []).append(g)
    for (device, dtype), gs in by_place.items():
        torch._foreach_mul_(gs, coef.to(device, dtype))


def clip_grad_norm_(pieces: Iterable[tuple[torch.Tensor, torch.Tensor | None]], max_norm: float, reducer: Reducer,
                    *, device: torch.device, norm_type: float = 2.0, also: Dims = ()) -> torch.Tensor:
    """Scale the gradients so that the whole model's gradient norm is at most max_norm; return that norm.

    Reading the returned tensor is a host sync: do it on logging steps only.
    """
    groups = norm_groups(pieces, also)
    total = global_norm(groups, reducer, device, float(norm_type))
    scale_([g for gs in groups.values() for g in gs], max_norm, total)
    return total
