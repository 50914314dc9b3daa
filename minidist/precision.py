"""Mixed precision, shared by every engine: which dtype each copy of the model lives in.

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

A training step touches three copies of the weights and their gradients:

    master parameters   fp32, what the optimizer updates (and its state: Adam's
                        two moments, so 4 + 8 = 12 bytes per parameter, K = 12)
    compute parameters  param_dtype (bf16/fp16: 2 bytes), what forward and backward read
    gradients           produced in param_dtype, reduced across ranks in reduce_dtype,
                        accumulated into the fp32 master gradient

which is the (2 + 2 + K) psi of the ZeRO paper. Casting the parameters once per
step at the module boundary (not per op, as autocast does) is what lets a
sharded engine all_gather half the bytes.

Why divide before *and* after the sum: an fp16 gradient summed over N ranks can
overflow (fp16's largest value is 65504) even when the average is small, and a
gradient divided by N before summing can underflow. Dividing by about sqrt(N)
before and the rest after keeps both in range; bf16 and fp32 have fp32's
exponent range, so they divide once, after the sum (cheaper: the reduced tensor
is smaller or equal). This is FSDP2's rule (`_get_gradient_divide_factors`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """As torch's FSDP2 policy: param_dtype for the parameters' compute copy (and an
    all_gather's payload), reduce_dtype for gradient reduction.

    The master parameters, their gradients and the optimizer state stay in the
    module's dtype (fp32). reduce_dtype None = param_dtype (None too = no casts).
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None

    def reduce_dtype_for(self, master_dtype: torch.dtype) -> torch.dtype:
        """The dtype gradients are reduced in, given the master parameters' dtype."""
        return self.reduce_dtype or self.param_dtype or master_dtype


def divide_factors(world_size: int, reduce_dtype: torch.dtype) -> tuple[float, float]:
    """(pre, post): divide the gradient by `pre` before the sum over `world_size` ranks
    and by `post` after it; pre * post = world_size.

    fp16 (overflow risk): pre doubles from 1 while it divides N and is below
    N / pre, so it ends near sqrt(N) (N = 64: 8 and 8), as FSDP2 chooses it;
    bf16, fp32 or one rank: (1, N).
    """
    if reduce_dtype in (torch.float32, torch.float64, torch.bfloat16) or world_size == 1:
        return 1.0, float(world_size)
    pre = 1
    while world_size % pre == 0 and world_size / pre > pre:
        pre *= 2
    return float(pre), world_size / pre


def cast_floating(tree, dtype: torch.dtype):
    """`tree` (args, kwargs, nested lists/dicts) with every floating tensor cast to `dtype`.

    What an engine that computes in param_dtype does to a module's inputs (FSDP2's
    cast_forward_inputs): a float32 batch meets bf16 weights in the first layer.
    """
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x, tree)
