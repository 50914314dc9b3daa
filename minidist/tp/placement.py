"""Which slice of a full parameter a tensor-parallel rank holds, and its tensor-parallel group.

A TP layer keeps only its rank's slice of each weight, as an ordinary nn.Parameter of the
local shape, and declares it over "tp" with minidist.sharding (the one declaration every
split parameter carries: clipping, checkpoints and FSDP read the same attribute):

    spec = sharding_of(param)     # Split(dim=0, parts=3), or None: replicated over tp
    full = full_tensor(param, group)               # a collective over the tp group
    mine = cut(full, spec, rank, size)             # what rank `rank` of `size` holds

`parts` > 1: the fused q|k|v projection is three blocks of n_embd rows, each split over
the ranks (minidist.sharding explains the order). A parameter without a declaration is
whole on every rank of the tp group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.mesh import TP
from minidist.sharding import Split, cut, join, shard_param, split_of


def sharded_parameter(whole: torch.Tensor, dim: int, rank: int, size: int, parts: int = 1) -> nn.Parameter:
    """This rank's slice of `whole` along `dim` as a new Parameter, declared split over "tp"."""
    p = nn.Parameter(cut(whole.detach(), Split(dim, parts), rank, size), requires_grad=whole.requires_grad)
    return shard_param(p, TP, dim, parts)


def sharding_of(param: torch.Tensor) -> Split | None:
    """How `param` is split over the tensor-parallel ranks; None when every rank holds all of it."""
    return split_of(param, TP)


def full_tensor(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The whole tensor from every rank's slice (an all_gather over `group`); `local` itself if replicated."""
    spec = sharding_of(local)
    if spec is None:
        return local
    size = dist.get_world_size(group)
    piece = local.detach().contiguous()
    out = torch.empty(size * piece.numel(), dtype=piece.dtype, device=piece.device)
    comm.all_gather(out, piece.view(-1), group=group)
    return join(list(out.view(size, *piece.shape).unbind(0)), spec)


def tp_group(device_mesh: DeviceMesh) -> tuple[dist.ProcessGroup, int, int]:
    """(process group, rank in it, its size) of a 1-D tensor-parallel mesh; one line if it is not one."""
    names = device_mesh.mesh_dim_names
    if device_mesh.ndim != 1:
        raise ValueError(f"tensor parallelism spans one mesh dimension, got a {device_mesh.ndim}-D mesh with "
                         f"dimensions {names}; pass mesh[{TP!r}]")
    if names is not None and names != (TP,):
        raise ValueError(f"tensor parallelism runs over a mesh dimension named {TP!r}, got {names[0]!r}; "
                         f"build the mesh with mesh_dim_names=({TP!r},)")
    return device_mesh.get_group(), device_mesh.get_local_rank(), device_mesh.size()
