"""minidist.zero: ZeRO stage 1, the optimizer state sharded across ranks.

Read partition.py (who owns what), then sharded_optimizer.py (step, broadcast, checkpoint).
"""

from minidist.zero.partition import partition_by_numel
from minidist.zero.sharded_optimizer import ShardedOptimizer

__all__ = ["ShardedOptimizer", "partition_by_numel"]
