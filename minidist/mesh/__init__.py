"""The parallel layout of a job: named dimensions, their degrees, and every question asked of them.

    dims = ParallelDims.infer(world_size=4, shard=2, hybrid=True)   # degrees, checked against the world
    layout = dims.build("cpu")          # a torch DeviceMesh with named dimensions, and its sub-meshes
    layout["dp"], layout["shard"]       # the 1-D mesh an engine spans, by name
    layout.dp_rank, layout.is_main      # which data shard is mine, am I the process that writes files

Four kinds of dimension (torchtitan's ParallelDims, Megatron's groups):

    replicate  data parallel, parameters copied (DDP's all_reduce, hybrid FSDP across replicas)
    shard      data parallel, parameters split (FSDP's all_gather and reduce_scatter)
    cp         context parallel: ranks hold different tokens of the same sequences, the same weights
               (between data parallelism and tp: its ring runs every layer too; "dp_cp" flattens both)
    tp         tensor parallel: ranks hold slices of the same layers and read the same data
    pp         pipeline parallel: ranks hold different layers (stages) and read the same data,
               outermost (its point-to-point messages are the cheapest: across nodes)

A mesh lays the ranks out as an array, tp innermost (tp's collectives run every layer, so
its ranks are consecutive: the same node). Data parallelism that is only replicated or only
sharded is one dimension, "dp"; hybrid sharding keeps both, ("replicate", "shard"), and
"dp" is then their flattening (one group over both, for the data-parallel reductions).
At N = 8, hybrid, shard = 2, tp = 2:

                  shard 0          shard 1
                  tp 0    tp 1     tp 0    tp 1
    replicate 0   rank 0  rank 1   rank 2  rank 3
    replicate 1   rank 4  rank 5   rank 6  rank 7

    tp group of rank 0: {0, 1}   shard group: {0, 2}   replicate group: {0, 4}   dp group: {0, 2, 4, 6}

Engines are handed the sub-mesh they work over by name (layout["dp"], layout["tp"]),
never a global, and use ranks inside their groups. The trainer asks the questions below
(which data shard is mine, who writes files, over which ranks a loss or a norm is summed)
of the layout, never of the global rank: a new dimension changes the answers here, in one
place. Where a parameter is split over a dimension, `shard_param` says so on the parameter
itself, and clipping and checkpoints read it (minidist.sharding).

Read in this order, each module importing only those before it:

    names   the dimensions' names (DP, REPLICATE, SHARD, CP, TP, PP, the flattened DP_CP, ...) and their order
    layout  Layout: a built mesh's questions (sizes, ranks, the data-parallel dimensions, all_reduce),
            the same questions of a plain mesh, and group_of (an engine's one dimension)
    dims    ParallelDims: how a world factors into degrees, checked, and the mesh built from them;
            the plain meshes the engines take (data_parallel_mesh, hybrid_mesh)
"""

from minidist.mesh.names import (CP, DATA_PARALLEL_DIMS, DIM_ORDER, DP, DP_CP, PP, REPLICATE, REPLICATE_CP,
                                 SHARD, SHARD_CP, TP)
from minidist.mesh.layout import Layout, all_reduce_dp, dp_rank, dp_size, group_of, is_main, main_rank
from minidist.mesh.dims import ParallelDims, data_parallel_mesh, hybrid_mesh
from minidist.sharding import SHARDED_OVER, Split, shard_param, sharded_over  # noqa: F401 - the layout's users
# declare split parameters through minidist.mesh too; minidist.sharding is where the declaration lives

__all__ = ["DP", "REPLICATE", "SHARD", "CP", "DP_CP", "SHARD_CP", "REPLICATE_CP", "TP", "PP", "DATA_PARALLEL_DIMS",
           "DIM_ORDER", "Layout", "dp_size", "dp_rank", "is_main", "main_rank", "all_reduce_dp", "group_of",
           "ParallelDims", "data_parallel_mesh", "hybrid_mesh"]
