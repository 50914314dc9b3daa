"""Where a gradient sits while its bucket is reduced, and the reducer's own reduction.

Two ways a bucket travels (``reduces_in_place`` chooses, per bucket):

* **in place** (the default on the CPU): each ``p.grad`` is divided by N in
  place (one pass, half the memory traffic of a copy) and all_reduced where it
  is: a gradient of SEPARATE_MIN_BYTES or more by its own all_reduce, the
  bucket's smaller ones as one coalesced collective (comm.all_reduce_coalesced:
  gloo packs them into one buffer and unpacks the sums into each ``p.grad`` on
  its own worker thread). The thread running backward only divides and
  enqueues; nothing is left to copy at the end of backward, and no flat buffer
  is allocated (one gradient-sized buffer less).
* **through the flat buffer**: ``p.grad`` is copied into its slot of the
  bucket's flat buffer (or with gradient_as_bucket_view already is that slot),
  the flat buffer is reduced, and at the end of backward the reducer copies
  each average back into ``p.grad``. For registered comm hooks (their contract
  is ``bucket.buffer()``), gradient_as_bucket_view, accelerators (copies are
  kernels queued on a stream there, not host work, and the in-place way was
  measured on gloo only) and buckets whose packed part would be
  IN_PLACE_MAX_BYTES or more.

Why it matters (benchmarks/ddp_vs_torch.py, a backward that sleeps to emulate
accelerator compute, 32 MiB of gradients, world 2, 2 cores): the copy into each
bucket and the copy back into p.grad are host work on the critical path that no
overlap can hide (a 32 MiB copy takes ~7-12 ms there). In place, the
main-thread CPU time that synchronising adds to a step fell from 13-18 ms (as
torch's DDP) to 4-12 ms, the shortest wall time from the last gradient to the
end of backward from ~7 ms (torch's too) to ~1 ms, and the share of the all_reduce
hidden at 1-25 MB buckets from 2-77% to 64-75% (torch: 27-63%).

The reducer's own reduction (``allreduce_presummed``, used when no hook is
registered) sums gradients that were divided by N on their way in: the
division costs no extra pass where a gradient is copied anyway, and nothing
runs after the collective. It stays private: as a hook it would return N times
the average wherever the reducer did not pre-divide (comm_hooks.py). It
declares its divided input (DIVIDED_INPUT), so the reducer pre-divides whenever
it is the registered hook.

Its future is the Work's own (several Works' combined by
comm.collect_all: torch.futures.collect_all, in C++): no Python continuation runs on the
communication thread (under comm.trace() one does, to time completions and waits). A continuation would hold the GIL there while it ran, delaying that
thread's next collective and stalling autograd's Python hooks (measured at
~2-3% of the CPU benchmark's step when the copy into p.grad was one).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.buckets.bucket import Bucket
from minidist.buckets.policy import ReducerPolicy
from minidist.precision import divide_factors

IN_PLACE_MAX_BYTES = 32 * 2**20
"""A bucket whose packed part (the gradients not reduced alone) is larger travels through the
flat buffer: gloo allocates its packing buffer afresh for every coalesced call, and glibc serves
allocations of 32 MiB or more with fresh pages (mmap) each time; faulting them in cost more than
the copies saved (measured: a fresh 33 MB buffer took 3x as long to fill as a reused one)."""

DIVIDED_INPUT = "_minidist_divided_input"
"""A hook with this attribute True gets gradients already divided (by N, or under join the divisor)."""


SEPARATE_MIN_BYTES = 2**20
"""In place, a contiguous gradient of at least this size is all_reduced on its own, not packed:
packing costs two passes over it on the communication thread, more than one more collective."""


def _reduced_alone(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.numel() * t.element_size() >= SEPARATE_MIN_BYTES


def allreduce_presummed(state, bucket: Bucket) -> torch.futures.Future:
    """all_reduce(SUM) of gradients already divided by N: the bucket's own tensors, in place or flat."""
    group = state if isinstance(state, dist.ProcessGroup) else None
    if not bucket.in_place:
        return comm.all_reduce(bucket.buffer(), comm.ReduceOp.SUM, group=group, async_op=True).get_future()
    futures, packed = [], []
    for g in bucket.grads:
        if _reduced_alone(g):
            futures.append(comm.all_reduce(g, comm.ReduceOp.SUM, group=group, async_op=True).get_future())
        else:
            packed.append(g)
    if packed:
        futures.append(comm.all_reduce_coalesced(packed, comm.ReduceOp.SUM, group=group, async_op=True).get_future())
    return futures[0] if len(futures) == 1 else comm.collect_all(futures)


setattr(allreduce_presummed, DIVIDED_INPUT, True)


def takes_divided_input(hook) -> bool:
    return getattr(hook, DIVIDED_INPUT, False)


def reduces_in_place(hook, policy: ReducerPolicy, bucket: Bucket, postscale: float | None = None) -> bool:
    """In place only where nothing follows the sum (no postscale) and p.grad has the bucket's dtype."""
    packed = sum(p.numel() * p.element_size() for p in bucket.params if not _reduced_alone(p))
    return (takes_divided_input(hook) and not policy.gradient_as_bucket_view and postscale is None
            and bucket.dtype == bucket.params[0].dtype
            and bucket.params[0].device.type == "cpu" and packed < IN_PLACE_MAX_BYTES)


def scales(hook, world_size: int, divisor: int, reduce_dtype: torch.dtype | None = None
           ) -> tuple[float | None, float | None]:
    """(prescale, postscale) for an average over `divisor` ranks (N, or under join those with inputs).

    prescale multiplies each gradient on its way in (hooks with divided input);
    postscale, N / divisor, multiplies a plain hook's average when divisor != N. An fp16
    sum divides about sqrt(divisor) before and the rest after (minidist.precision.divide_factors):
    summed whole it could overflow, divided by N first it could underflow.
    """
    if takes_divided_input(hook):
        if reduce_dtype == torch.float16:
            pre, post = divide_factors(divisor, torch.float16)
            return 1.0 / pre, (1.0 / post if post != 1.0 else None)
        return 1.0 / divisor, None
    return None, (world_size / divisor if divisor != world_size else None)


def take_in_place(p: nn.Parameter, bucket: Bucket, j: int, scale: float) -> None:
    """p.grad itself, divided in place, is what the bucket reduces: no copy on this thread."""
    g = p.grad
    if g is None:
        g = torch.zeros_like(p)  # unused this iteration (find_unused_parameters)
    else:
        g.mul_(scale)
    bucket.grads[j] = g


def copy_into_flat(p: nn.Parameter, bucket: Bucket, j: int, scale: float | None, as_view: bool) -> None:
    """p.grad into its slot of the flat buffer (divided on the way when `scale` is given)."""
    view = bucket.views[j]
    g = p.grad
    if g is None:
        view.zero_()  # unused this iteration (find_unused_parameters)
    elif g.data_ptr() == view.data_ptr() and g.shape == view.shape:
        if scale is not None:
            view.mul_(scale)  # gradient_as_bucket_view: already in place
    else:
        if scale is not None:
            torch.mul(g, scale, out=view)  # copy and divide in one pass
        else:
            view.copy_(g)
        if as_view:
            p.grad = view  # from now on autograd accumulates straight into the bucket


def write_back(p: nn.Parameter, result: torch.Tensor, in_place: bool, as_view: bool) -> None:
    """End of backward: make p.grad the reduced `result` (a flat-buffer view, or in place the tensor reduced)."""
    if in_place:
        if p.grad is not result:  # p.grad was None: `result` is the zeros it contributed, reduced
            p.grad = result
    elif as_view:
        if p.grad is None or p.grad.data_ptr() != result.data_ptr():
            p.grad = result  # normally it already is the view, reduced in place
    elif p.grad is None:
        p.grad = result.clone()
    else:
        p.grad.copy_(result)
