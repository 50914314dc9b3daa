"""minidist.buckets: gradient buckets, the machinery below DDP and ZeRO.

Both engines reduce gradients the same way up to the collective itself: a hook fires when
autograd has accumulated a parameter's gradient -> the gradient goes into its bucket ->
a full bucket launches its collective, strictly in bucket order -> a callback at the end
of backward completes and waits for every bucket. DDP all_reduces each bucket
(reducer.py, this package); ZeRO reduce_scatters it (minidist.zero.reduce_scatter) over
the same assignment and launcher.

Read in this order:

    policy        which gradients travel together (assign_buckets, ReducerPolicy: why the
                  first and the last bucket are small, with the cost formula)
    launcher      hook -> bucket -> launch in order -> end-of-backward callback
    bucket        one all_reduce bucket's flat buffer and its lifecycle
    reduction     in place or through the flat buffer; the default all_reduce
    ready_order   the one rebuild of the buckets, in the order gradients became ready
    layout        the buckets in launch order, and each parameter's slot in them
    finalize      the end of a reducing backward: unused parameters, the averages into p.grad
    reducer       the all_reduce reducer (minidist.DDP's, and ZeRO's owner-broadcast variant's)
    footprint     what the all_reduce reducer holds, instant by instant
"""

from minidist.buckets.bucket import Bucket, BucketState
from minidist.buckets.launcher import OrderedLauncher, hook_gradients, is_reduced, mark_reduced, queue_end_of_backward
from minidist.buckets.policy import ReducerPolicy, assign_buckets
from minidist.buckets.reducer import Reducer

__all__ = ["Bucket", "BucketState", "OrderedLauncher", "hook_gradients", "is_reduced", "mark_reduced",
           "queue_end_of_backward", "ReducerPolicy", "assign_buckets", "Reducer"]
