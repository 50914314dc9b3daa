"""Coalesced collectives: many tensors, one collective, each tensor read and written where it lies.

    all_reduce_coalesced(tensors)               each tensor all-reduced in place (DDP's buckets)
    all_gather_coalesced(outputs, inputs)       inputs[i] from every rank into outputs[i] (FSDP's gather)
    reduce_scatter_coalesced(outputs, inputs)   inputs[i] reduced, chunk rank into outputs[i] (FSDP's gradients)

Each moves the bytes of one collective over the tensors end to end and is traced as that one
call; what changes is who copies. A single-tensor collective needs its tensors side by side
in one buffer (a copy in, and for a gather a copy out, on the caller's thread); here the
backend (gloo, on its worker thread), NCCL (one call per tensor in one group, straight into
place) or minidist's ring (minidist.comm.ring, reading the pieces in place) does it. Each
calls the process group directly: torch's wrappers for the first two warn that they are
deprecated.

Collective: every rank of `group` calls each of them, in the same order as its other collectives.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from minidist.comm import ring as _ring
from minidist.comm.collectives import Group, _check_op, _is_gloo, _issue, _size
from minidist.comm.fallbacks import FinishingWork, _native_reduce_scatter


def all_reduce_coalesced(tensors: Sequence[torch.Tensor], op=ReduceOp.SUM, *, group: Group = None,
                         async_op: bool = False):
    """all_reduce every tensor of `tensors` (one dtype and device), in place, as one collective.

    gloo flattens them into one buffer, reduces it and copies the result back,
    all on its own worker thread (the caller's thread only enqueues); NCCL runs
    one all_reduce per tensor in one group. Traced as one all_reduce of their
    total size. Calls the process group directly: torch's wrapper
    (dist.all_reduce_coalesced) warns that it is deprecated.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    _check_op(op)
    tensors = list(tensors)
    avg_on_gloo = op == ReduceOp.AVG and _is_gloo(group)

    def call():
        opts = dist.AllreduceCoalescedOptions()
        opts.reduceOp = ReduceOp.SUM if avg_on_gloo else op
        work = (group or dist.group.WORLD).allreduce_coalesced(tensors, opts)
        if avg_on_gloo:
            n = _size(group)
            work = FinishingWork(work, lambda: [t.div_(n) for t in tensors])
        if async_op:
            return work
        work.wait()
        return None

    return _issue("all_reduce", tensors[0], sum(t.numel() for t in tensors), group, call, async_op=async_op,
                  handed=tensors)


def all_gather_coalesced(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *,
                         group: Group = None, async_op: bool = False):
    """all_gather every `inputs[i]` into `outputs[i]` ([rank0 | rank1 | ...], N x its numel), as one collective.

    gloo gathers one flat buffer of every input and copies each rank's pieces into
    the outputs, all on its own worker thread (the caller's thread only enqueues);
    NCCL runs one all_gather per tensor in one group, straight into the outputs.
    Same bytes as one all_gather of the inputs end to end; traced as that. Calls the
    process group directly (torch's wrapper, all_gather_coalesced, is deprecated).

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    outputs, inputs = list(outputs), list(inputs)
    n = _size(group)

    def call():
        work = (group or dist.group.WORLD).allgather_into_tensor_coalesced(outputs, inputs)
        if async_op:
            return work
        work.wait()
        return None

    return _issue("all_gather", inputs[0], n * sum(t.numel() for t in inputs), group, call, async_op=async_op,
                  handed=outputs + inputs)


def reduce_scatter_coalesced(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], op=ReduceOp.SUM, *,
                             group: Group = None, async_op: bool = False, algorithm: str | None = None):
    """reduce_scatter every `inputs[i]` (N x outputs[i].numel() elements) into `outputs[i]`, as one collective.

    The same as laying the inputs rank-major (rank j's chunk: the j-th N-th of every input, end
    to end) and reduce_scattering that once, with the same bytes, but the ring (minidist.comm.ring,
    gloo's default) reads the inputs where they lie, and NCCL runs one reduce_scatter per tensor in
    one group, from the inputs in place. gloo's native collective (an all_reduce inside; its own
    coalesced form runs one per tensor) gets the rank-major copy. SUM, PRODUCT, MIN or MAX (for an
    average: SUM, then divide). Traced as one reduce_scatter of the inputs' total size.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    if op not in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX):
        raise ValueError(f"reduce_scatter_coalesced reduces with SUM, PRODUCT, MIN or MAX, got {op}; "
                         f"for an average, SUM and divide")
    outputs, inputs = list(outputs), list(inputs)
    n, numel = _size(group), sum(x.numel() for x in inputs)
    impl = _ring.choose(algorithm, group, inputs[0])
    staged = impl != "ring" and _is_gloo(group)
    flat = torch.cat([x.reshape(n, -1) for x in inputs], dim=1).view(-1) if staged else None  # rank-major
    out = flat.new_empty(numel // n) if staged else None

    def call():
        if impl == "ring":
            return _ring.ring_reduce_scatter(outputs, inputs, group, async_op, op)
        if not staged:  # NCCL: one reduce_scatter per tensor, from the inputs in place
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = op
            work = (group or dist.group.WORLD).reduce_scatter_tensor_coalesced(outputs, inputs, opts)
            if async_op:
                return work
            work.wait()
            return None
        copy = lambda: [o.copy_(p.view_as(o)) for o, p in zip(outputs, out.split([o.numel() for o in outputs]))]  # noqa: E731
        work = _native_reduce_scatter(out, flat, op, group, async_op)
        if async_op:
            return FinishingWork(work, copy)
        copy()
        return None

    return _issue("reduce_scatter", outputs[0], numel, group, call, algorithm=impl, async_op=async_op,
                  handed=outputs + inputs + ([flat, out] if staged else []))
