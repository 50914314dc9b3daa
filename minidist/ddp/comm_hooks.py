"""Communication hooks: how one full bucket becomes its averaged gradient.

The contract mirrors torch's ``DistributedDataParallel.register_comm_hook``:

    hook(state, bucket) -> torch.futures.Future[Tensor]

``bucket`` is a minidist.ddp.bucket.Bucket (``bucket.buffer()`` is the flat
gradient, ``bucket.parameters()`` its parameters). The future's value must be
a tensor of ``bucket.buffer()``'s shape (or a one-element list of it, as a
Work's own future gives) holding the *average* over ranks; the reducer copies
it into the bucket unless it already is the bucket's buffer.
``state`` is whatever was registered with the hook; for the built-in hooks it
is the process group (None = the world).

Why a future and not a tensor: the hook is called from inside backward, the
moment the bucket is full; it must start communication and return at once so
that backward keeps computing while the bytes travel. The reducer waits on all
futures only at the end of backward.

All communication goes through minidist.comm (so traces see it).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from minidist import comm
from minidist.ddp.bucket import Bucket

CommHook = Callable[[Any, Bucket], torch.futures.Future]


def _world(state) -> int:
    return dist.get_world_size(state if isinstance(state, dist.ProcessGroup) else None)


def _group(state):
    return state if isinstance(state, dist.ProcessGroup) else None


def allreduce_hook(state, bucket: Bucket) -> torch.futures.Future:
    """The textbook average: all_reduce(SUM) the bucket in place, then divide by the world size.

    Sends 2 S (N-1)/N bytes per rank for a bucket of S bytes (ring all_reduce).
    """
    buf = bucket.buffer()
    n = _world(state)
    work = comm.all_reduce(buf, comm.ReduceOp.SUM, group=_group(state), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(n))


def presummed_allreduce_hook(state, bucket: Bucket) -> torch.futures.Future:
    """The reducer's own default: all_reduce(SUM) of gradients already divided by the world size.

    When no hook is registered, the reducer multiplies each gradient by 1/N
    *while* copying it into the bucket (one fused pass, as torch's reducer
    does), so nothing is left to do after the sum. allreduce_hook instead
    divides after the sum: one more pass over the bucket, on the critical path
    for the last bucket, which is why it is not the default.
    """
    # The Work's own future (its value is [bucket.buffer()], reduced in place): no Python
    # continuation, so no Python runs on gloo's thread (see reducer.py: why copy at the end).
    return comm.all_reduce(bucket.buffer(), comm.ReduceOp.SUM, group=_group(state), async_op=True).get_future()


def _compress_hook(dtype: torch.dtype):
    def hook(state, bucket: Bucket) -> torch.futures.Future:
        buf = bucket.buffer()
        n = _world(state)
        # Divide *before* the cast-and-sum, as torch's fp16_compress_hook does:
        # a sum of N half-precision gradients can overflow fp16 where their mean does not.
        compressed = buf.to(dtype).div_(n)
        work = comm.all_reduce(compressed, comm.ReduceOp.SUM, group=_group(state), async_op=True)

        def decompress(fut):
            return buf.copy_(fut.value()[0])  # cast back into the bucket's own dtype
        return work.get_future().then(decompress)
    hook.__name__ = f"{str(dtype).removeprefix('torch.')}_compress_hook"
    hook.__doc__ = (f"Cast the bucket to {dtype}, all_reduce the mean, cast back: half the bytes "
                    f"(S (N-1)/N per rank) for ~3 significant digits of gradient precision.")
    return hook


fp16_compress_hook: CommHook = _compress_hook(torch.float16)
bf16_compress_hook: CommHook = _compress_hook(torch.bfloat16)

__all__ = ["CommHook", "allreduce_hook", "presummed_allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]
