"""minidist.ddp: data parallelism by bucketed, overlapped all_reduce of gradients.

The buckets, their launch in order and the all_reduce reducer are minidist.buckets (shared
with ZeRO): read that package first. Then, in this order: comm_hooks.py (how a full bucket
is reduced), mixed_precision.py (fp32 masters and their compute copies), ddp.py (the
public module), join.py (uneven inputs), powersgd.py (a compressing hook with state).
"""

from minidist.buckets import Bucket, BucketState, Reducer, ReducerPolicy, assign_buckets
from minidist.ddp.comm_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook, state_factory
from minidist.ddp.ddp import DDP
from minidist.ddp.join import Join
from minidist.ddp.powersgd import PowerSGDState, powersgd_hook

__all__ = ["DDP", "Bucket", "BucketState", "assign_buckets", "Reducer", "ReducerPolicy", "Join",
           "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "state_factory",
           "PowerSGDState", "powersgd_hook"]
