"""The names of the mesh's dimensions, and their order (minidist.mesh's docstring draws the grid).

A name, not a position, is how every engine, record and checkpoint refers to a dimension: a
layout with or without tp, hybrid or not, answers to the same names.
"""

DP = "dp"
"""Data parallelism as one dimension (DDP, ZeRO, full_shard, ...), or the flattening of (replicate, shard)."""
REPLICATE, SHARD = "replicate", "shard"
"""The two dimensions of hybrid sharding: across replicas, and within a shard group (FSDP2's order)."""
CP = "cp"
"""The context-parallel dimension: ranks that read the same sequences and keep different tokens of them
(minidist.cp). They hold the same weights but see different tokens, so their gradients are reduced
together with the data-parallel ones: over DP_CP."""
DP_CP = "dp_cp"
"""The data-parallel dimensions and cp flattened into one (torchtitan's dp_cp): what DDP and FSDP span
under context parallelism. Without cp it is "dp"."""
SHARD_CP, REPLICATE_CP = "shard_cp", "replicate_cp"
"""Hybrid sharding's dimensions with the cp ranks joined (FSDP2's 2-D mesh under context parallelism:
Layout.hybrid_dims). cp ranks hold the same weights, so they join the shard dimension where the engine
shards (hybrid_shard: torchtitan's dp_shard_cp), the replicate one where it only replicates (no_shard)."""
TP = "tp"
"""The tensor-parallel dimension: ranks that hold different slices of the same layers and see the same data."""
DATA_PARALLEL_DIMS = (DP, REPLICATE, SHARD)
"""Dimensions over which ranks see different data (cp is not one: its ranks read the same rows)."""
PP = "pp"
"""The pipeline dimension: ranks that hold different stages of the model (minidist.pp)."""
DIM_ORDER = (PP, REPLICATE, SHARD, DP, CP, TP)
"""Outermost first (torchtitan's order): the last dimension's ranks are consecutive."""
