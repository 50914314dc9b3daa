"""minidist.ddp: data parallelism by bucketed, overlapped all_reduce of gradients.

Read in this order: bucket.py (which gradients travel together), comm_hooks.py
(how a full bucket is reduced), reduction.py (in place or through the flat
buffer; the default reduction), ready_order.py (the one rebuild), reducer.py
(autograd hook -> bucket -> all_reduce -> p.grad), ddp.py (the public module),
join.py (uneven inputs), powersgd.py (a compressing hook with state).
"""

from minidist.ddp.bucket import Bucket, BucketState, ReducerPolicy, assign_buckets
from minidist.ddp.comm_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook, state_factory
from minidist.ddp.ddp import DDP
from minidist.ddp.join import Join
from minidist.ddp.powersgd import PowerSGDState, powersgd_hook
from minidist.ddp.reducer import Reducer

__all__ = ["DDP", "Bucket", "BucketState", "assign_buckets", "Reducer", "ReducerPolicy", "Join",
           "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "state_factory",
           "PowerSGDState", "powersgd_hook"]
