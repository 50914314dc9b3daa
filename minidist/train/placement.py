"""What follows from a parameter being split over a mesh dimension: its norm and its whole value.

A parameter split over a dimension says so (minidist.mesh.shard_param: a tensor-parallel
layer over "tp", FSDP's shards over "dp" or "shard"); a parameter that says nothing is
whole on every rank. Two consequences, each a function here:

    global_norm(params, layout)     the norm of the full model's gradient: each parameter's
                                    squared norm summed over the dimensions that split it and
                                    nowhere else (a replicated gradient counts once)
    gather_whole / local_slice      a whole tensor from the slices along "tp" (for a checkpoint
                                    or the final model), and this rank's slice of a whole one

A wrapper that makes new parameter objects (FSDP's shards) loses attributes, so the
declarations are carried by name: `by_name` before wrapping, `redeclare` after.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from minidist import comm
from minidist.mesh import SHARDED_OVER, Layout, sharded_over


# ------------------------------------------------------------------------- declarations
def by_name(module: nn.Module) -> dict[str, dict[str, int | None]]:
    """{parameter name: its declaration} for every name of every parameter (tied names included)."""
    return {n: sharded_over(p) for n, p in module.named_parameters(remove_duplicate=False)}


def redeclare(module: nn.Module, declared: dict[str, dict[str, int | None]], split_by_wrapper: tuple[str, ...]) -> None:
    """After a wrapper replaced `module`'s parameters: each keeps what it declared before (by name),
    plus the dimensions the wrapper split it over. A wrapper that declares any of its parameters
    (shard_param) is taken at its word for all of them (undeclared: whole); one that declares
    none splits every parameter over `split_by_wrapper` (tensor dim None: the wrapper decides how).
    """
    params = list(module.named_parameters(remove_duplicate=False))
    wrapper_declares = any(hasattr(p, SHARDED_OVER) for _, p in params)
    for name, p in params:
        added = sharded_over(p) if wrapper_declares else {d: None for d in split_by_wrapper}
        setattr(p, SHARDED_OVER, declared.get(name, {}) | added)


def tensor_dims(module: nn.Module, dim: str) -> dict[str, int]:
    """{state_dict key: tensor dim} of the parameters split over mesh dimension `dim` along a tensor dim."""
    return {n: d[dim] for n, d in by_name(module).items() if d.get(dim) is not None}


# ------------------------------------------------------------------------------- norms
@torch.no_grad()
def global_norm(params: list[torch.Tensor], layout: Layout, norm_type: float = 2.0) -> torch.Tensor:
    """The norm of the whole model's gradient from this rank's gradients, the same on every rank.

    Parameters are grouped by the dimensions that split them; a group's local sum of
    |g|^p is summed over those dimensions only (max for the inf-norm), so each element of
    the full gradient is counted once: a slice is added to the other slices, a replica is
    not added to its copies. Cost: one scalar all_reduce per group and dimension.
    """
    groups: dict[tuple[str, ...], list[torch.Tensor]] = {}
    for p in params:  # every parameter, so that every rank forms the same groups
        grads = groups.setdefault(tuple(sorted(sharded_over(p))), [])
        if p.grad is not None:
            grads.append(p.grad)
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
def gather_whole(tensors: dict[str, torch.Tensor], dims: dict[str, int], layout: Layout, dim: str) -> dict:
    """`tensors` with each entry named in `dims` replaced by the concatenation of its slices along
    mesh dimension `dim` (in coordinate order, along tensor dim dims[name]); the rest as they are.

    A collective over `dim`'s group: every rank of it calls with the same names. Slices are equal
    in size (tensor parallelism splits evenly). Nothing to do where the dimension has one rank.
    """
    n = layout.size(dim)
    if n == 1:
        return dict(tensors)
    group = layout[dim].get_group()
    out = dict(tensors)
    for name in sorted(k for k in tensors if k in dims):
        t = tensors[name].to(layout.device).contiguous()  # NCCL gathers device tensors only
        parts = [torch.empty_like(t) for _ in range(n)]
        comm.all_gather(parts, t, group=group)
        out[name] = torch.cat(parts, dim=dims[name]).to(tensors[name].device)
    return out


def local_slice(tensors: dict[str, torch.Tensor], dims: dict[str, int], layout: Layout, dim: str) -> dict:
    """This rank's slice (along mesh dimension `dim`) of each whole tensor named in `dims`; gather_whole's inverse."""
    n, coord = layout.size(dim), layout.coordinate.get(dim, 0)
    out = dict(tensors)
    for name in tensors:
        if name in dims and n > 1:
            whole = tensors[name]
            if whole.shape[dims[name]] % n:
                raise ValueError(f"{name}: {whole.shape[dims[name]]} rows along dim {dims[name]} do not split "
                                 f"evenly over {dim}={n}")
            out[name] = whole.chunk(n, dims[name])[coord].clone()
    return out
