"""Which slice of a full parameter a tensor-parallel rank holds: the one declaration every TP parameter carries.

A TP layer keeps only its rank's slice of each weight, as an ordinary nn.Parameter of the
local shape (state_dict keys and optimizers see nothing unusual). What the slice *is* goes
on the parameter, so that code which needs the whole (gradient clipping sums squared norms
over the ranks that split a parameter, a checkpoint reassembles it) can ask without knowing
which layer made it:

    spec = sharding_of(param)     # TPShard(dim=0, parts=3, mesh_dim="tp"), or None: replicated
    full = full_tensor(param, spec, group)       # a collective over the tp group
    mine = local_slice(full, spec, rank, size)   # what rank `rank` of `size` holds

`dim` is the split dimension. `parts` > 1 says that dimension is several equal blocks, each
split over the ranks: the fused q|k|v projection is three blocks of n_embd rows, and a rank
holds its heads' rows of q, of k and of v, concatenated (torch's DTensor calls this a strided
shard). A parameter without a declaration is whole on every rank of the tp group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.mesh import TP

ATTR = "_minidist_tp_shard"
"""The attribute of a parameter that holds its TPShard."""


@dataclass(frozen=True)
class TPShard:
    """This rank holds 1/size of tensor dim `dim` (of each of its `parts` blocks) over mesh dimension `mesh_dim`."""

    dim: int
    parts: int = 1
    mesh_dim: str = TP


def mark_sharded(param: torch.Tensor, dim: int, parts: int = 1) -> torch.Tensor:
    """Declare that `param` is this rank's slice along `dim` over "tp"; returns it."""
    setattr(param, ATTR, TPShard(dim, parts))
    return param


def sharding_of(param: torch.Tensor) -> TPShard | None:
    """How `param` is split over tensor-parallel ranks; None when every rank holds all of it."""
    return getattr(param, ATTR, None)


def local_slice(full: torch.Tensor, spec: TPShard, rank: int, size: int) -> torch.Tensor:
    """The piece of `full` that rank `rank` of `size` holds under `spec` (a new tensor, not a view of `full`)."""
    blocks = full.chunk(spec.parts, dim=spec.dim)
    if any(b.shape[spec.dim] % size for b in blocks) or full.shape[spec.dim] % spec.parts:
        raise ValueError(f"dimension {spec.dim} of a {tuple(full.shape)} tensor does not split into "
                         f"{spec.parts} block(s) of {size} equal slices")
    return torch.cat([b.chunk(size, dim=spec.dim)[rank] for b in blocks], dim=spec.dim).clone()


def full_tensor(local: torch.Tensor, spec: TPShard | None, group: dist.ProcessGroup) -> torch.Tensor:
    """The whole tensor from every rank's slice (an all_gather over `group`); `local` itself if replicated."""
    if spec is None:
        return local
    size = dist.get_world_size(group)
    piece = local.detach().movedim(spec.dim, 0).contiguous()
    out = torch.empty(size * piece.numel(), dtype=piece.dtype, device=piece.device)
    comm.all_gather(out, piece.view(-1), group=group)
    per_rank = [p.chunk(spec.parts, dim=0) for p in out.view(size, *piece.shape).unbind(0)]
    blocks = [torch.cat([per_rank[r][b] for r in range(size)], dim=0) for b in range(spec.parts)]
    return torch.cat(blocks, dim=0).movedim(0, spec.dim)


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
