"""minidist.zero: ZeRO, the optimizer state (stage 1) and the gradients (stage 2) sharded across ranks.

The buckets are minidist.buckets' (which gradients travel together, launched in order).
Read in this order: bucket_shards.py (equal flat shards: who updates which elements),
bucket.py (the flat buffers and their lifecycle), reduce_scatter.py (backward: hook ->
bucket -> reduce_scatter), all_gather.py (after step: every shard back into the
parameters), flat_shards.py (the paper's step, its bytes and memory),
sharded_optimizer.py (the public optimizer), state_dict.py (checkpoints at any world
size); then partition.py and owner_broadcast.py, the owner-broadcast variant (torch's
ZeroRedundancyOptimizer design) kept for comparison.
"""

from minidist.zero.bucket_shards import BucketShards, Piece
from minidist.zero.partition import partition_by_numel
from minidist.zero.sharded_optimizer import ShardedOptimizer

__all__ = ["ShardedOptimizer", "BucketShards", "Piece", "partition_by_numel"]
