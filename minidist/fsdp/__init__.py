"""minidist.fsdp: fully sharded data parallelism on all_gather / reduce_scatter.

Read in this order, each module importing only those before it:

    param        a unit's flat buffer, its shard, and the two parameter sets
    collectives  the all_gather, and the gradient reduction (reduce_scatter, replica
                 all_reduce, divide) as one GradReduction object; MeshInfo
    schedule     shared, passive data: unit order, prefetch queue, sync flag
    unit         one unit's lifecycle: its sharded and training states, the forward
                 and backward hooks, activation-checkpointing recompute, end of backward
    state_dict   checkpoints, through the public API below
    api          the FSDP module: units, strategies, no_sync, clipping, state dicts
"""

from minidist.fsdp.api import FSDP, MixedPrecisionPolicy, ShardingStrategy
from minidist.fsdp.collectives import GradReduction, MeshInfo
from minidist.fsdp.param import FlatParamShard
from minidist.fsdp.schedule import Schedule
from minidist.fsdp.unit import FSDPUnit, ShardedState, TrainingState

__all__ = ["FSDP", "MixedPrecisionPolicy", "ShardingStrategy", "FlatParamShard", "GradReduction", "MeshInfo",
           "ShardedState", "Schedule", "FSDPUnit", "TrainingState"]
