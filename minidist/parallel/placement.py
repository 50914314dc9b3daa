"""What follows from a parameter being split over a mesh dimension: its norm and its whole value.

A parameter split over a dimension says so (minidist.sharding: a tensor-parallel layer
over "tp", FSDP's shards over "dp" or "shard"); a parameter that says nothing is whole on
every rank. Two consequences, each a function here:

    global_norm(params, layout)     the norm of the full model's gradient: each parameter's
                                    squared norm summed over the dimensions that split it and
                                    nowhere else (a replicated gradient counts once)
    gather_whole / local_slice      a whole tensor from the slices along "tp" (for a checkpoint
                                    or the final model), and this rank's slice of a whole one,
                                    q | k | v blocks included (minidist.sharding.join / cut)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from minidist import comm
from minidist.mesh import Layout
from minidist.sharding import Split, cut, join, sharded_over


def splits(module: nn.Module, dim: str) -> dict[str, Split]:
    """{state_dict key: Split} of the parameters split over mesh dimension `dim` along a tensor dim
    (every name of a tied parameter)."""
    out = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        split = sharded_over(p).get(dim)
        if split is not None and split.dim is not None:
            out[n] = split
    return out


# ------------------------------------------------------------------------------- norms
def dims_of(param: torch.Tensor, also: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The mesh dimensions that split `param` (and `also`), sorted: the key of its group for a norm."""
    return tuple(sorted(set(sharded_over(param)) | set(also)))


def grads_by_dims(params: list[torch.Tensor]) -> dict[tuple[str, ...], list[torch.Tensor]]:
    """{the dimensions that split a parameter: the gradients of those parameters}, a key for every
    parameter given, gradient or not, so that every rank forms the same groups (and collectives)."""
    groups: dict[tuple[str, ...], list[torch.Tensor]] = {}
    for p in params:
        grads = groups.setdefault(dims_of(p), [])
        if p.grad is not None:
            grads.append(p.grad)
    return groups


@torch.no_grad()
def global_norm(params: list[torch.Tensor] | dict[tuple[str, ...], list[torch.Tensor]], layout: Layout,
                norm_type: float = 2.0) -> torch.Tensor:
    """The norm of the whole model's gradient from this rank's gradients, the same on every rank.

    `params`: the parameters (their .grad), or gradients already grouped by the dimensions that
    split them (grads_by_dims; ZeRO's partitions add "dp"). A group's local sum of |g|^p is
    summed over those dimensions only (max for the inf-norm), so each element of the full
    gradient is counted once: a slice is added to the other slices, a replica is not added to
    its copies. Cost: one scalar all_reduce per group and dimension.
    """
    groups = params if isinstance(params, dict) else grads_by_dims(params)
    inf = math.isinf(norm_type)
    total = torch.zeros((), dtype=torch.float32, device=layout.device)  # gradients may live elsewhere (CPU offload)
    for dims in sorted(groups):
        part = torch.nn.utils.get_total_norm(groups[dims], norm_type).to(total.device, torch.float32)
        part = part if inf else part ** norm_type
        layout.all_reduce(part, dims, comm.ReduceOp.MAX if inf else comm.ReduceOp.SUM)
        total = torch.maximum(total, part) if inf else total + part
    return total if inf else total ** (1.0 / norm_type)


# ----------------------------------------------------------------------- whole <-> slices
@torch.no_grad()
def gather_whole(tensors: dict[str, torch.Tensor], split: dict[str, Split], layout: Layout, dim: str) -> dict:
    """`tensors` with each entry named in `split` replaced by the whole tensor joined from its slices
    along mesh dimension `dim` (in coordinate order, as split[name] says); the rest as they are.

    A collective over `dim`'s group: every rank of it calls with the same names. Slices are equal
    in size (tensor parallelism splits evenly). Nothing to do where the dimension has one rank.
    """
    n = layout.size(dim)
    if n == 1:
        return dict(tensors)
    group = layout[dim].get_group()
    out = dict(tensors)
    for name in sorted(k for k in tensors if k in split):
        t = tensors[name].to(layout.device).contiguous()  # NCCL gathers device tensors only
        parts = [torch.empty_like(t) for _ in range(n)]
        comm.all_gather(parts, t, group=group)
        out[name] = join(parts, split[name]).to(tensors[name].device)
    return out


def local_slice(tensors: dict[str, torch.Tensor], split: dict[str, Split], layout: Layout, dim: str) -> dict:
    """This rank's slice (along mesh dimension `dim`) of each whole tensor named in `split`; gather_whole's inverse."""
    n, coord = layout.size(dim), layout.coordinate.get(dim, 0)
    out = dict(tensors)
    for name in tensors:
        if name in split and n > 1:
            try:
                out[name] = cut(tensors[name], split[name], coord, n)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc} (over {dim}={n})") from None
    return out
