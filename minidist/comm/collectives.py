"""One small, stateless function per collective, each delegating to torch.distributed.

    call            who gives data     who ends with the answer
    broadcast       src                everyone
    reduce          everyone           dst only (other ranks' tensors are not meaningful)
    all_reduce      everyone           everyone
    gather          everyone           dst, a piece from each
    all_gather      everyone           everyone, every piece in rank order
    scatter         src                everyone, one piece each
    reduce_scatter  everyone           everyone, its piece of the reduced whole
    all_to_all      everyone           everyone, piece i of rank j lands as piece j on rank i
    barrier         nobody             nobody; it only synchronises

Every function here is a collective: every rank of `group` must call it, the same calls in the
same order (ranks match collectives by issue order, not by name), including the ranks that are
not `src` or `dst`. A rank that skips one leaves the others waiting inside it until the process
group's timeout (the flight recorder then names the call and the missing rank).

Every function takes `group` (None = the world) and `async_op`. With async_op a
Work handle comes back: wait() on it before reading the result (on NCCL wait()
orders the current stream after the collective instead of blocking the host).

Ranks are named as in torch.distributed: `src` and `dst` are global ranks,
`group_src` and `group_dst` are ranks inside `group` (what an engine that was
handed a mesh dimension knows); give one or the other. global_rank() is the one
place where minidist turns a group rank into a global one.

Where a backend lacks something, a documented equivalent runs instead (fallbacks.py), never a
silently different answer:
  * ReduceOp.AVG on gloo (absent in old builds, and it has had correctness bugs):
    SUM, then divide by the group size.
  * reduce_scatter on a backend without it (older gloo): all_reduce a copy of the
    input, then keep this rank's chunk. Same result, twice the wire traffic.

reduce_scatter chooses its algorithm (algorithm="auto" | "native" | "ring", None = the
process default of minidist.comm.ring.set_reduce_scatter_algorithm): gloo's own
reduce_scatter is an all_reduce inside (each rank sends 2 S (N-1)/N, twice the ring
minimum), so "auto" runs minidist.comm.ring's point-to-point ring on gloo (S (N-1)/N)
and the backend's collective elsewhere (NCCL's is a ring already). The trace records
which ran and the bytes it really sends (Record.algorithm, Record.wire_bytes).
PREMUL_SUM is not offered: it exists on NCCL only; scale, then SUM.

Each call is recorded by every active minidist.comm.trace() and by the flight
recorder (flight_recorder.py); with MINIDIST_DEBUG_COLLECTIVES=1 the ranks first
check that they agree on it (fingerprint.py).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from minidist.comm import fingerprint as _fingerprint
from minidist.comm import flight_recorder as _flight
from minidist.comm import ring as _ring
from minidist.comm import trace as _trace
from minidist.comm.groups import global_rank
from minidist.comm.fallbacks import _avg_via_sum, _native_reduce_scatter
from minidist.comm.release import Handed

Group = dist.ProcessGroup | None
# Reduce ops every backend here computes natively, plus AVG through the fallback.
SUPPORTED_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG)

# torch 2.14 names the single-tensor form all_gather_single; older releases only have *_into_tensor.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _size(group: Group) -> int:
    return dist.get_world_size(group)


def _is_gloo(group: Group) -> bool:
    return dist.get_backend(group) == "gloo"


def _root(rank: int, group_rank: int | None, group: Group) -> int:
    """The global rank of a collective's root, given as a global `rank` or as a `group_rank`."""
    return rank if group_rank is None else global_rank(group, group_rank)


def _check_op(op) -> None:
    if op not in SUPPORTED_OPS:
        raise ValueError(f"reduce op {op} is not supported by minidist.comm; use one of SUM, PRODUCT, MIN, MAX, AVG")


def _issue(op: str, tensor: torch.Tensor | None, numel: int, group: Group, call: Callable,
           is_root: bool = False, algorithm: str = "native", root: int | None = None,
           async_op: bool = False, handed: Sequence[torch.Tensor] = ()):
    """Run one collective: flight-record it, check its fingerprint (debug), record it in active traces.

    handed: the tensors `call` gives the backend. A synchronous call returns only once the
    backend has let go of them (release.py), so that they die on this thread; an async one
    leaves that to whoever owns the Work."""
    entry = _flight.issue(op, tensor, numel, group)
    try:
        if _fingerprint.ENABLED:
            _fingerprint.check(op, tensor, numel, group, entry)
        refs = None if async_op else Handed(handed, whole_storage=True)
        issued = time.perf_counter()
        work = _flight.issued(entry, call())
        if refs is not None:
            refs.wait_released()
    except Exception as e:  # noqa: BLE001 - recorded as failed, then re-raised unchanged (a timeout: named)
        _flight.on_failure(entry, e)
        raise
    if not _trace._ACTIVE:
        return work
    return _trace.record(op, tensor, numel, group, work, issued, is_root=is_root, algorithm=algorithm,
                         root=None if root is None else dist.get_group_rank(group or dist.group.WORLD, root))


def broadcast(tensor: torch.Tensor, src: int = 0, *, group: Group = None, group_src: int | None = None,
              async_op: bool = False):
    """Copy `tensor` from rank `src` (or group rank `group_src`) into `tensor` on every rank (in place).

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    src = _root(src, group_src, group)
    return _issue("broadcast", tensor, tensor.numel(), group,
                  lambda: dist.broadcast(tensor, src, group=group, async_op=async_op),
                  is_root=dist.get_rank() == src, root=src, async_op=async_op, handed=[tensor])


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, *, group: Group = None, async_op: bool = False):
    """Reduce `tensor` across ranks with `op`; every rank ends with the result (in place).

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    _check_op(op)

    def run(real_op):
        return dist.all_reduce(tensor, real_op, group=group, async_op=async_op)

    def call():
        if op == ReduceOp.AVG and _is_gloo(group):
            return _avg_via_sum(tensor, group, run, async_op)
        return run(op)

    return _issue("all_reduce", tensor, tensor.numel(), group, call, async_op=async_op, handed=[tensor])


def reduce(tensor: torch.Tensor, dst: int = 0, op=ReduceOp.SUM, *, group: Group = None,
           group_dst: int | None = None, async_op: bool = False):
    """Reduce `tensor` across ranks onto rank `dst` (or group rank `group_dst`). Only dst's tensor is meaningful afterwards.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    _check_op(op)
    dst = _root(dst, group_dst, group)
    is_dst = dist.get_rank() == dst

    def run(real_op):
        return dist.reduce(tensor, dst, real_op, group=group, async_op=async_op)

    def call():
        if op == ReduceOp.AVG and _is_gloo(group):
            if not is_dst:  # only the destination divides; the others' tensors are not meaningful
                return run(ReduceOp.SUM)
            return _avg_via_sum(tensor, group, run, async_op)
        return run(op)

    return _issue("reduce", tensor, tensor.numel(), group, call, is_root=is_dst, root=dst, async_op=async_op,
                  handed=[tensor])


def all_gather(output: torch.Tensor | list[torch.Tensor], input: torch.Tensor, *,
               group: Group = None, async_op: bool = False, algorithm: str = "native"):
    """Every rank's `input`, in rank order, into `output` on every rank.

    `output` is either a list of N tensors shaped like `input`, or one tensor of
    N * input.numel() elements laid out [rank0 | rank1 | ...] along dim 0.
    `algorithm`: "native" (the default), or "ring" / "auto" (the ring where the backend
    is gloo on CPU tensors, as for reduce_scatter) for one output tensor: minidist.comm.ring's
    ring receives into `output` in place, where gloo's own stages the whole output first.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    n = _size(group)
    impl = _ring.choose(algorithm, group, input) if isinstance(output, torch.Tensor) else "native"
    handed = [input, *([output] if isinstance(output, torch.Tensor) else output)]
    if impl == "ring":
        return _issue("all_gather", input, input.numel() * n, group,
                      lambda: _ring.ring_all_gather(output, input, group, async_op), algorithm="ring",
                      async_op=async_op, handed=handed)
    if isinstance(output, torch.Tensor):
        call = lambda: _all_gather_single(output, input, group=group, async_op=async_op)  # noqa: E731
    else:
        call = lambda: dist.all_gather(list(output), input, group=group, async_op=async_op)  # noqa: E731
    return _issue("all_gather", input, input.numel() * n, group, call, async_op=async_op, handed=handed)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor | Sequence[torch.Tensor], op=ReduceOp.SUM, *,
                   group: Group = None, async_op: bool = False, algorithm: str | None = None):
    """Reduce `input` across ranks and leave chunk `rank` of the result in `output`.

    `input` is one tensor of N * output.numel() elements (chunk r = rows r*k..(r+1)*k)
    or a list of N tensors shaped like `output`. `algorithm`: see the module docstring.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    _check_op(op)
    n = _size(group)
    flat = input if isinstance(input, torch.Tensor) else torch.cat([t.reshape(-1) for t in input])
    if flat.numel() != output.numel() * n:
        raise ValueError(f"reduce_scatter: input has {flat.numel()} elements, expected {n} x {output.numel()}")
    impl = _ring.choose(algorithm, group, flat)

    def run(real_op):
        if impl == "ring":
            return _ring.ring_reduce_scatter(output, flat, group, async_op, real_op)
        return _native_reduce_scatter(output, flat, real_op, group, async_op)

    def call():
        if op == ReduceOp.AVG and (impl == "ring" or _is_gloo(group)):
            return _avg_via_sum(output, group, run, async_op)
        return run(op)

    return _issue("reduce_scatter", output, flat.numel(), group, call, algorithm=impl, async_op=async_op,
                  handed=[output, flat])


def gather(input: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int = 0, *,
           group: Group = None, group_dst: int | None = None, async_op: bool = False):
    """Collect every rank's `input` into `gather_list` on rank `dst`.

    gather_list must be a list of N tensors on dst and None on every other rank.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    dst = _root(dst, group_dst, group)
    is_dst = dist.get_rank() == dst
    if is_dst and gather_list is None:
        raise ValueError("gather: the destination rank must pass gather_list")
    if not is_dst and gather_list is not None:
        raise ValueError("gather: gather_list must be None on ranks other than dst")
    return _issue("gather", input, input.numel() * _size(group), group,
                  lambda: dist.gather(input, gather_list, dst, group=group, async_op=async_op), is_root=is_dst,
                  root=dst, async_op=async_op, handed=[input, *(gather_list or ())])


def scatter(output: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int = 0, *,
            group: Group = None, group_src: int | None = None, async_op: bool = False):
    """Hand piece r of `scatter_list` on rank `src` to rank r's `output`.

    scatter_list must be a list of N tensors on src and None on every other rank.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    src = _root(src, group_src, group)
    is_src = dist.get_rank() == src
    if is_src and scatter_list is None:
        raise ValueError("scatter: the source rank must pass scatter_list")
    if not is_src and scatter_list is not None:
        raise ValueError("scatter: scatter_list must be None on ranks other than src")
    return _issue("scatter", output, output.numel() * _size(group), group,
                  lambda: dist.scatter(output, scatter_list, src, group=group, async_op=async_op), is_root=is_src,
                  root=src, async_op=async_op, handed=[output, *(scatter_list or ())])


def all_to_all(output: torch.Tensor | list[torch.Tensor], input: torch.Tensor | list[torch.Tensor], *,
               group: Group = None, async_op: bool = False):
    """Chunk j of rank i's `input` becomes chunk i of rank j's `output`.

    Either single tensors split evenly along dim 0 into N chunks, or lists of N tensors.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    if isinstance(input, torch.Tensor):
        numel = input.numel()
        call = lambda: dist.all_to_all_single(output, input, group=group, async_op=async_op)  # noqa: E731
        ref = input
    else:
        numel = sum(t.numel() for t in input)
        call = lambda: dist.all_to_all(list(output), list(input), group=group, async_op=async_op)  # noqa: E731
        ref = input[0]
    handed = [output, input] if isinstance(input, torch.Tensor) else [*output, *input]
    return _issue("all_to_all", ref, numel, group, call, async_op=async_op, handed=handed)


def barrier(*, group: Group = None, async_op: bool = False):
    """Return once every rank of the group has called barrier.

    Collective: every rank of `group` calls it, in the same order as its other collectives.
    """
    return _issue("barrier", None, 0, group, lambda: dist.barrier(group=group, async_op=async_op), async_op=async_op)
