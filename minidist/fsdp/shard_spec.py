"""Where every shard lives: the mesh FSDP works over (MeshInfo), and each parameter's ShardSpec.

FSDP2's arrangement: each parameter is sharded on its own along dim 0. A parameter of R rows
(dim 0; a 0-dim parameter counts as one row) and C elements per row, over a shard group of
N ranks:

    c = ceil(R / N) rows per shard       rank r holds rows [r c, min((r + 1) c, R))
    padded shard = c C elements          rows past R are zeros (torch.chunk's split)

    weight, R = 5, N = 2 (c = 3)         rank 0: rows 0 1 2      rank 1: rows 3 4 + a zero row

so every rank's piece is a dim-0 slice of the parameter with its trailing dimensions, at
most c rows, possibly empty (R < N). The metadata that says so, ShardSpec, rides on every
sharded parameter (`param.shard_spec`): its global shape, dtype, the mesh dimensions it is
placed on (by name, minidist.mesh) with a torch placement for each (Shard(0): split along
dim 0; Replicate(): a whole copy), and its storage and compute devices. The placements are
torch.distributed.tensor's own classes used as plain metadata: the tensors stay plain
tensors (DTensor's dispatch would cost every optimizer op a Python detour on the CPU).

MeshInfo is the same arrangement seen from the unit: the process groups it gathers and
reduces over, this rank's place in each, the dimensions' names, read from the mesh as FSDP2
reads it (resolve_mesh). CPUOffloadPolicy moves storage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

if TYPE_CHECKING:  # imported where built: torch.distributed.tensor costs ~0.6 s (sympy) per process
    from torch.distributed.tensor import Replicate, Shard

from minidist.mesh import DP, REPLICATE, REPLICATE_CP, SHARD, SHARD_CP, group_of


@dataclass(frozen=True)
class MeshInfo:
    """The groups one FSDP model shards and reduces over, and this rank's place in them.

    shard: the ranks that split the parameters (shard_world 1 = no_shard; group None =
    the world). replicate: the ranks holding the same shard, whose gradient shards are
    all_reduced (HSDP's replicas, or every rank for no_shard; world 1 = none).
    shard_dim / replicate_dim: the mesh dimensions' names (None where there is none, or
    where the shard dimension has one rank: nothing is split then).
    """

    shard_group: dist.ProcessGroup | None
    shard_world: int
    shard_rank: int
    replicate_group: dist.ProcessGroup | None
    replicate_world: int
    replicate_rank: int
    shard_dim: str | None = None
    replicate_dim: str | None = None

    @property
    def grad_divisor(self) -> int:
        """Ranks whose gradients are summed: the average divides by all of them."""
        return self.shard_world * self.replicate_world

    @property
    def is_first(self) -> bool:
        """Group rank 0 in both groups: the rank that holds full values for rank0_only."""
        return self.shard_rank == 0 and self.replicate_rank == 0


def _place(group) -> tuple[int, int]:
    """(size, this rank's rank) of a group (None = the world)."""
    return dist.get_world_size(group), dist.get_rank(group)


def resolve_mesh(mesh: DeviceMesh | None, process_group) -> MeshInfo:
    """The groups FSDP shards and replicates over, read from the mesh as FSDP2 reads it.

    A 1-D mesh (whatever its name), a process group, or neither (the world): the parameters
    are sharded over all of its ranks. A mesh with dimensions REPLICATE and SHARD
    (minidist.mesh.hybrid_mesh; other dimensions, such as tensor parallelism's, are not
    FSDP's): HSDP, sharded within mesh[SHARD] and replicated across mesh[REPLICATE]; a shard
    dimension of one rank shards nothing, every rank replicates the whole model (no_shard,
    as FSDP2 expresses it). A larger mesh without REPLICATE: its SHARD (or DP) dimension.
    """
    names = tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
    rep_dim = next((d for d in (REPLICATE, REPLICATE_CP) if d in names), None)  # with cp ranks joined:
    shard_dim = next((d for d in (SHARD, SHARD_CP) if d in names), None)        # minidist.mesh.SHARD_CP
    if rep_dim and shard_dim:
        rep, shard = mesh[rep_dim].get_group(), mesh[shard_dim].get_group()
        (shard_world, shard_rank), replicas = _place(shard), _place(rep)
        if shard_world == 1:  # replicated only: nothing is split over SHARD
            return MeshInfo(None, 1, 0, rep, *replicas, None, rep_dim)
        return MeshInfo(shard, shard_world, shard_rank, rep, *replicas, shard_dim, rep_dim)
    dim = names[0] if len(names) == 1 else DP
    if mesh is not None and mesh.ndim > 1:
        dim = next((d for d in (SHARD, DP) if d in names), None)
        if dim is None:
            raise ValueError(f"FSDP spans one mesh dimension, or {REPLICATE!r} x {SHARD!r} (HSDP), got dimensions "
                             f"{names or 'without names'}: pass a 1-D mesh, or one from minidist.mesh.hybrid_mesh")
        mesh = mesh[dim]
    group = group_of("FSDP", process_group, mesh)
    return MeshInfo(group, *_place(group), None, 1, 0, dim, None)


@dataclass(frozen=True)
class CPUOffloadPolicy:
    """As torch's FSDP2 CPUOffloadPolicy: shards, their gradients and so the optimizer state live
    in host memory; each unit's parameters are copied to the compute device for its all_gather
    and its gradients copied back after their reduction. pin_memory: page-locked host buffers,
    so that those copies can run asynchronously (CUDA only)."""

    pin_memory: bool = True


@dataclass(frozen=True)
class ShardSpec:
    """Where one parameter's shards live, as every sharded parameter carries it (`param.shard_spec`)."""

    fqn: str
    global_shape: torch.Size
    dtype: torch.dtype
    """The master (storage) dtype; compute runs in the policy's param_dtype."""
    mesh_dims: tuple[str, ...]
    placements: tuple[Shard | Replicate, ...]
    """One per mesh dimension: Shard(0) where the rows are split, Replicate() where copies live."""
    shard_rank: int
    shard_world: int
    storage_device: torch.device
    compute_device: torch.device

    @property
    def rows(self) -> int:
        return self.global_shape[0] if len(self.global_shape) else 1

    @property
    def row_numel(self) -> int:
        return math.prod(self.global_shape[1:])

    @property
    def rows_per_shard(self) -> int:
        """c = ceil(R / N): every rank's padded shard has this many rows."""
        return -(-self.rows // self.shard_world)

    @property
    def padded_shard_numel(self) -> int:
        return self.rows_per_shard * self.row_numel

    def row_range(self, rank: int | None = None) -> tuple[int, int]:
        """[start, end) of the rows `rank` (default: this rank) holds; empty past the last row."""
        rank = self.shard_rank if rank is None else rank
        c = self.rows_per_shard
        return min(rank * c, self.rows), min((rank + 1) * c, self.rows)

    @property
    def local_shape(self) -> torch.Size:
        """Shape of this rank's sharded parameter: (its rows, *trailing dimensions)."""
        start, end = self.row_range()
        return torch.Size((end - start, *self.global_shape[1:]))


def placements_for(mesh: MeshInfo) -> tuple[tuple[str, ...], tuple[Shard | Replicate, ...]]:
    """(mesh dimension names, placements) of every parameter of a model laid out over `mesh`."""
    from torch.distributed.tensor import Replicate, Shard  # only FSDP pays for DTensor's import

    dims, places = [], []
    if mesh.replicate_dim is not None:
        dims.append(mesh.replicate_dim)
        places.append(Replicate())
    if mesh.shard_dim is not None:
        dims.append(mesh.shard_dim)
        places.append(Shard(0))
    return tuple(dims), tuple(places)
