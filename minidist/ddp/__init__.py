"""minidist.ddp: data parallelism by bucketed, overlapped all_reduce of gradients.

Read in this order: bucket.py (which gradients travel together), comm_hooks.py
(how a full bucket is reduced), reducer.py (autograd hook -> bucket -> all_reduce
-> p.grad), ddp.py (the public module).
"""

from minidist.ddp.bucket import Bucket, BucketState, assign_buckets
from minidist.ddp.comm_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook, presummed_allreduce_hook
from minidist.ddp.ddp import DDP
from minidist.ddp.powersgd import PowerSGDState, powersgd_hook
from minidist.ddp.reducer import Reducer, ReducerPolicy

__all__ = ["DDP", "Bucket", "BucketState", "assign_buckets", "Reducer", "ReducerPolicy",
           "allreduce_hook", "presummed_allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "PowerSGDState", "powersgd_hook"]
