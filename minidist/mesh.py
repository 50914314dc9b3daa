"""The parallel layout of a job as a torch DeviceMesh: named dimensions, one process group each.

    topo = minidist.runtime.init()
    mesh = minidist.mesh.data_parallel_mesh(topo)       # 1-D ("dp",): DDP, ZeRO-1, full_shard, ...
    mesh = minidist.mesh.hybrid_mesh(topo, shard=2)     # 2-D ("replicate", "shard"): hybrid_shard
    model = minidist.FSDP(net, mesh=mesh)

A mesh lays the N ranks out as an array; every slice along one dimension is a
process group. For hybrid sharding at N = 4 with shard = 2:

                 shard 0   shard 1
    replicate 0  rank 0    rank 1      <- a shard group: splits the parameters
    replicate 1  rank 2    rank 3      <- another, holding the same shards
                   ^ a replicate group: same shard, gradients all_reduced

Engines are handed the mesh (or one of its dimensions) explicitly, never look up a
global, and use ranks *inside* their groups. The trainer asks the questions below
(which data shard is mine, am I the process that writes files) of the mesh, never
of the global rank, so that adding a dimension that is not data parallel (tensor
parallelism) changes the answers in one place.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from minidist import comm
from minidist.runtime import Topology

DP = "dp"
"""The one dimension of a purely data-parallel mesh (DDP, ZeRO-1, full_shard, ...)."""
REPLICATE, SHARD = "replicate", "shard"
"""The two dimensions of a hybrid mesh: across replicas, and within a shard group (FSDP2's order)."""
TP = "tp"
"""The tensor-parallel dimension: ranks that hold different slices of the same layers and see the same data."""
DATA_PARALLEL_DIMS = (DP, REPLICATE, SHARD)
"""Dimensions over which ranks see different data."""


def data_parallel_mesh(topo: Topology) -> DeviceMesh:
    """A 1-D mesh over every rank of the job, dimension "dp"."""
    return init_device_mesh(topo.device.type, (topo.world_size,), mesh_dim_names=(DP,))


def hybrid_mesh(topo: Topology, shard: int) -> DeviceMesh:
    """A 2-D (N / shard) x shard mesh, dimensions ("replicate", "shard"); ranks of a row shard together.

    Rows are consecutive ranks, so with shard = ranks per node the shard group's
    all_gathers and reduce_scatters stay on the node's fast links and only the
    replicate all_reduce (1/shard of the bytes) crosses nodes.
    """
    n = topo.world_size
    if shard < 1 or n % shard:
        raise ValueError(f"hybrid sharding: shard size {shard} must be >= 1 and divide the {n} ranks of the job")
    return init_device_mesh(topo.device.type, (n // shard, shard), mesh_dim_names=(REPLICATE, SHARD))


def _dp_dims(mesh: DeviceMesh) -> list[int]:
    names = mesh.mesh_dim_names or ()
    return [i for i, name in enumerate(names) if name in DATA_PARALLEL_DIMS]


def dp_size(mesh: DeviceMesh) -> int:
    """How many different data shards the job reads: the product of the data-parallel dimensions."""
    return math.prod(mesh.size(i) for i in _dp_dims(mesh))


def dp_rank(mesh: DeviceMesh) -> int:
    """Which data shard this rank reads: its coordinate along the data-parallel dimensions, row-major."""
    coord = mesh.get_coordinate()
    rank = 0
    for i in _dp_dims(mesh):
        rank = rank * mesh.size(i) + coord[i]
    return rank


def is_main(mesh: DeviceMesh) -> bool:
    """The one process that writes logs, plots and whole-model files: coordinate 0 on every dimension."""
    return not any(mesh.get_coordinate())


def all_reduce_dp(tensor: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Sum `tensor` over every data-parallel rank (one all_reduce per dimension), in place."""
    for i in _dp_dims(mesh):
        if mesh.size(i) > 1:
            comm.all_reduce(tensor, comm.ReduceOp.SUM, group=mesh.get_group(i))
    return tensor


def group_of(who: str, process_group, mesh: DeviceMesh | None):
    """The process group an engine that works over one dimension uses: `process_group`, or `mesh`'s only one.

    Engines accept either, as torch's do; a 2-D mesh must be sliced by name first
    (mesh["shard"]), so that which dimension an engine spans is always written down.
    """
    if mesh is None:
        return process_group
    if process_group is not None:
        raise ValueError(f"{who}: pass a process group or a mesh, not both")
    if mesh.ndim != 1:
        raise ValueError(f"{who} spans one mesh dimension, got a {mesh.ndim}-D mesh with dimensions "
                         f"{mesh.mesh_dim_names}; pass one of them, e.g. mesh[{(mesh.mesh_dim_names or ('dp',))[-1]!r}]")
    return mesh.get_group()
