"""The end of a reducing backward: every parameter accounted for, every average in ``p.grad``.

Step 4 of the reducer's path (reducer.py): the autograd engine runs
``Reducer._finalize_backward`` once backward has produced every gradient it will
produce. What that callback does, in order, and the parts of it kept here:

1. parameters whose hook did not fire are an error (``unready_params``: their bucket's
   all_reduce would never complete on the ranks that wait for it), unless
   find_unused_parameters, in which case each is handed to its bucket as it is (its
   local gradient, accumulated under no_sync, or zeros), so every bucket fills;
2. with find_unused_parameters, one blocking all_reduce of an int32 "used" bitmap
   (``globally_used``: 4 bytes per parameter tensor) says which parameters some rank
   gave a gradient since the last sync. It costs no graph walk (torch walks the
   autograd graph from the outputs after each forward): the end of backward already
   knows which hooks did not fire. A parameter used on some rank only is averaged
   everywhere; one used by no rank keeps its ``p.grad`` as it was, as in one process;
3. each bucket's future is waited on in bucket order and its averages are written into
   ``p.grad`` (``write_averages``) on this thread, as torch's reducer does in its
   finalize_backward: no Python on the communication thread (reduction.py).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.buckets import reduction
from minidist.buckets.bucket import Bucket
from minidist.precision import MixedPrecisionPolicy


class MasterParams(Protocol):
    """What the reducer asks of mixed precision's fp32 masters (minidist.ddp.mixed_precision.MixedPrecisionParams)."""

    policy: MixedPrecisionPolicy

    def use_masters(self) -> None: ...

    def master_grad(self, p: nn.Parameter, result: torch.Tensor) -> None: ...


def unready_params(ready: list[bool], names: list[str], find_unused_parameters: bool) -> list[int]:
    """The parameters that got no gradient in this backward; an error naming them unless find_unused_parameters."""
    missing = [i for i, r in enumerate(ready) if not r]
    if missing and not find_unused_parameters:
        listed = ", ".join(f"'{names[i]}'" for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise RuntimeError(
            f"DDP: {len(missing)} parameter(s) that require grad received no gradient in this backward: "
            f"{listed}. Every rank must produce a gradient for every bucketed parameter, or the "
            f"all_reduce of their bucket never completes. If they are legitimately unused in some "
            f"iterations, construct DDP(..., find_unused_parameters=True); if they are never trained, "
            f"set requires_grad=False on them.")
    return missing


def globally_used(used: list[bool], device: torch.device, group: dist.ProcessGroup | None) -> list[bool]:
    """One small all_reduce: did any rank give parameter i a gradient since the last sync?"""
    counts = torch.tensor(used, dtype=torch.int32, device=device)
    comm.all_reduce(counts, comm.ReduceOp.SUM, group=group)
    return (counts > 0).tolist()


def write_averages(bucket: Bucket, params: list[nn.Parameter], used: list[bool] | None, postscale: float | None,
                   mixed: MasterParams | None, gradient_as_bucket_view: bool) -> None:
    """Write a finished bucket's averages into its parameters' ``p.grad`` (or their fp32 masters').

    `used`: globally_used's answer (None: every parameter counts as used); `postscale`:
    the rescale a hook's sum still needs (Reducer._set_divisor), applied to the flat buffer.
    """
    if postscale is not None:
        bucket.flat.mul_(postscale)
    results = bucket.grads if bucket.in_place else bucket.views
    for i, result in zip(bucket.param_ids, results):
        if used is not None and not used[i]:  # unused by every rank: p.grad stays as it is, as in one process
            continue
        if mixed is not None:
            mixed.master_grad(params[i], result)
        else:
            reduction.write_back(params[i], result, bucket.in_place, gradient_as_bucket_view)
