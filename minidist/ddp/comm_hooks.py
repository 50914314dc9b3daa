"""Communication hooks: how one full bucket becomes its averaged gradient.

The contract is torch's ``DistributedDataParallel.register_comm_hook(state, hook)``:

    hook(state, bucket) -> torch.futures.Future[Tensor]

``bucket`` is a minidist.buckets.bucket.Bucket (``bucket.buffer()`` is the flat
gradient, ``bucket.parameters()`` its parameters). It holds this rank's *plain
local gradients* (sums over the micro-batches since the last synced backward,
nothing divided). The future's value must be a tensor of ``bucket.buffer()``'s
shape (or a one-element list of it, as a Work's own future gives) holding the
*average* over ranks; the reducer copies it into the bucket unless it already
is the bucket's buffer. Every public hook here keeps that contract, so any of
them registered (or called from a user's own hook) yields the average.

The reducer's own default, used when no hook is registered, is not among
them: it divides each gradient by N on its way in (fused into the copy into
the bucket as torch's reducer does, or in place in p.grad) and then only sums.
Exported as a hook, it would return N times the average wherever the reducer
did not pre-divide (registered by a user, or called from a user's hook); so it
lives, private, in minidist/buckets/reduction.py, and declares its divided input, so that the
reducer pre-divides whenever it is the registered hook. A registered hook
always gets the flat bucket (``bucket.buffer()``), never the in-place way.

``state`` is whatever was registered with the hook. ``DDP(..., comm_hook=hook)``
registers ``default_state(hook, process_group)``: the process group, unless the
hook declares a factory with ``@state_factory`` (PowerSGD builds its
PowerSGDState that way).

Why a future and not a tensor: the hook is called from inside backward, the
moment the bucket is full; it must start communication and return at once so
that backward keeps computing while the bytes travel. The reducer waits on all
futures only at the end of backward.

All communication goes through minidist.comm (so traces see it).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from minidist import comm
from minidist.buckets.bucket import Bucket
from minidist.buckets.reducer import CommHook

StateFactory = Callable[["dist.ProcessGroup | None"], Any]
_Hook = TypeVar("_Hook", bound=Callable)


def state_factory(factory: StateFactory) -> Callable[[_Hook], _Hook]:
    """Declare how ``DDP(..., comm_hook=hook)`` builds the hook's state: ``factory(process_group)``.

    The hook stays a plain function (importable as 'module:function', callable as torch's
    hooks are); the factory rides on it as an attribute.
    """
    def declare(hook: _Hook) -> _Hook:
        hook.state_factory = factory
        return hook
    return declare


def default_state(hook: Callable, process_group: dist.ProcessGroup | None) -> Any:
    """The state DDP registers with `hook` when the user gives none: the hook's factory, or the group."""
    factory = getattr(hook, "state_factory", None)
    return process_group if factory is None else factory(process_group)


def _group(state) -> dist.ProcessGroup | None:
    return state if isinstance(state, dist.ProcessGroup) else None


def allreduce_hook(state, bucket: Bucket) -> torch.futures.Future:
    """The textbook average: all_reduce(SUM) the bucket in place, then divide by the world size.

    Sends 2 S (N-1)/N bytes per rank for a bucket of S bytes (ring all_reduce).
    The division is one more pass over the bucket after the sum (on the critical
    path for the last bucket) and a Python continuation on the communication
    thread; the reducer's default path avoids both, which is why it is the default.
    """
    buf = bucket.buffer()
    group = _group(state)
    n = dist.get_world_size(group)
    work = comm.all_reduce(buf, comm.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(n))


def _compress_hook(dtype: torch.dtype):
    def hook(state, bucket: Bucket) -> torch.futures.Future:
        buf = bucket.buffer()
        group = _group(state)
        # Divide *before* the cast-and-sum, as torch's fp16_compress_hook does:
        # a sum of N half-precision gradients can overflow fp16 where their mean does not.
        compressed = buf.to(dtype).div_(dist.get_world_size(group))
        work = comm.all_reduce(compressed, comm.ReduceOp.SUM, group=group, async_op=True)

        def decompress(fut):
            return buf.copy_(fut.value()[0])  # cast back into the bucket's own dtype
        return work.get_future().then(decompress)
    hook.__name__ = hook.__qualname__ = f"{str(dtype).removeprefix('torch.')}_compress_hook"
    hook.__doc__ = (f"Cast the bucket to {dtype}, all_reduce the mean, cast back: half the bytes "
                    f"(S (N-1)/N per rank) for ~3 significant digits of gradient precision.")
    return hook


fp16_compress_hook: CommHook = _compress_hook(torch.float16)
bf16_compress_hook: CommHook = _compress_hook(torch.bfloat16)

__all__ = ["CommHook", "state_factory", "default_state", "allreduce_hook", "fp16_compress_hook",
           "bf16_compress_hook"]
