"""minidist.fsdp: fully sharded data parallelism on all_gather / reduce_scatter, FSDP2's per-parameter shards.

Read in this order, each module importing only those before it:

    shard_spec      where every shard lives: MeshInfo (groups, by mesh dimension name),
                    ShardSpec (one parameter's rows, placements, devices), CPUOffloadPolicy
    param           a unit's parameters, each sharded on its own along dim 0; the unit's
                    `local` and `full` buffers; the pieces each collective moves
    streams         where collectives run: CUDA side streams and events, or gloo's threads
    all_gather      one unit's copy-in and all_gather, straight into `full`
    reduce_scatter  one unit's gradient reduction (copy-in, pre-divide, reduce_scatter,
                    replica all_reduce, post-divide) as one GradReduction object
    schedule        shared, passive data: unit order, prefetch lists and queue, sync flag
    sharded_state   a unit's parameters sharded, gathering or gathered: the moves between
                    (unshard, reshard) and the prefetch of the units ahead
    unit            one unit's lifecycle: its training state, the forward and backward
                    hooks, activation-checkpointing recompute, end of backward
    state_dict      checkpoints (format 2: rows per parameter; format 1 still loads)
    api             the FSDP module: FSDP2's arguments, units, no_sync, clipping, state dicts
"""

from minidist.fsdp.all_gather import AllGather
from minidist.fsdp.api import FSDP, MixedPrecisionPolicy
from minidist.fsdp.shard_spec import CPUOffloadPolicy, MeshInfo, ShardSpec
from minidist.fsdp.param import FSDPParam, UnitShards
from minidist.fsdp.reduce_scatter import GradReduction
from minidist.fsdp.schedule import Schedule, prefetch_ahead
from minidist.fsdp.unit import FSDPUnit, ShardedState, TrainingState

__all__ = ["FSDP", "MixedPrecisionPolicy", "prefetch_ahead", "CPUOffloadPolicy", "ShardSpec", "FSDPParam",
           "UnitShards", "AllGather", "GradReduction", "MeshInfo", "ShardedState", "Schedule", "FSDPUnit",
           "TrainingState"]
