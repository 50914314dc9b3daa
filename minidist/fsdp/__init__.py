"""minidist.fsdp: fully sharded data parallelism on all_gather / reduce_scatter.

Read in this order: param (a unit's flat buffer and its shard), collectives (the
three collectives), unit (one unit's forward/backward lifecycle), schedule (unit
order, prefetch, end of backward), api (the FSDP module and its strategies),
state_dict (checkpoints).
"""

from minidist.fsdp.api import FSDP, MixedPrecisionPolicy, ShardingStrategy
from minidist.fsdp.param import FlatParamShard, ShardedState
from minidist.fsdp.schedule import Schedule
from minidist.fsdp.unit import FSDPUnit, TrainingState

__all__ = ["FSDP", "MixedPrecisionPolicy", "ShardingStrategy", "FlatParamShard",
           "ShardedState", "Schedule", "FSDPUnit", "TrainingState"]
