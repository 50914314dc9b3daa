"""A ring reduce_scatter from point-to-point sends: S (N-1)/N bytes per rank, the minimum (and a
ring all_gather that receives in place: ring_all_gather).

Why: gloo's reduce_scatter all_reduces a copy of the whole input and keeps one chunk, so
each rank sends 2 S (N-1)/N bytes, twice what a reduce_scatter needs (torch's FSDP2 on gloo
pays the same). A ring of isend/irecv moves the minimum:

    N ranks, group rank r, input = N chunks of k elements; chunk i is rank i's result
    step s = 0 .. N-2:
        send    chunk (r-1-s) mod N to r+1   (step 0: my input's chunk; later: what I reduced)
        receive chunk (r-2-s) mod N from r-1 and reduce my input's chunk of that index into it
    the chunk received at step N-2 is chunk r, reduced over all N inputs: the output.

    per rank: N-1 messages of S/N bytes: (N-1) alpha + S (N-1)/N beta   (cost.py's ring row)
    memory:   up to two scratch chunks of S/N (gloo's own path copies the whole input: S)

The ring pays N-1 latencies where halving-doubling pays log2 N: it wins on bandwidth and
can lose on tiny payloads at large N. SUM, PRODUCT, MIN and MAX reduce on the way; AVG is
SUM then one divide (collectives.py), as for gloo.

Who chooses: collectives.reduce_scatter(..., algorithm=) with "native", "ring" or "auto"
(None: the process default, set_reduce_scatter_algorithm / reduce_scatter_algorithm()).
"auto" picks the ring where the native collective moves more than the ring minimum: gloo on
CPU tensors; NCCL's reduce_scatter is already a ring.

Coalesced (FSDP's gradients): `output` and `input` may be lists, input i holding N x
output i's elements. Rank j's chunk is then the j-th N-th of every input, end to end: the
ring reads the pieces where they lie (the chunk it sends first is the one copy; each received
chunk is reduced with them piece by piece) and writes the outputs, end to end, so no
rank-major copy of the inputs is ever made.

async_op on CPU tensors: the ring runs on its group's lane (minidist.comm.lane), one thread
per process group that runs the group's rings in issue order.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from minidist.comm.groups import Group, global_rank
from minidist.comm.lane import dispatch

ALGORITHMS = ("auto", "native", "ring")
_TAG = 0x52494E47  # "RING": keeps the ring's messages apart from the user's point-to-point ones
_COMBINE: dict = {
    ReduceOp.SUM: lambda acc, x: acc.add_(x),
    ReduceOp.PRODUCT: lambda acc, x: acc.mul_(x),
    ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    ReduceOp.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
}
_default_algorithm = "auto"


def set_reduce_scatter_algorithm(name: str) -> str:
    """Make `name` ("auto", "native" or "ring") this process's default; return the previous one."""
    global _default_algorithm
    _check_algorithm(name)
    previous, _default_algorithm = _default_algorithm, name
    return previous


@contextlib.contextmanager
def reduce_scatter_algorithm(name: str) -> Iterator[None]:
    """Within the block, reduce_scatter calls without algorithm= use `name`."""
    previous = set_reduce_scatter_algorithm(name)
    try:
        yield
    finally:
        set_reduce_scatter_algorithm(previous)


def _check_algorithm(name: str) -> None:
    if name not in ALGORITHMS:
        raise ValueError(f"reduce_scatter algorithm must be one of {ALGORITHMS}, got {name!r}")


def choose(algorithm: str | None, group: Group, tensor: torch.Tensor) -> str:
    """"native" or "ring": what runs for `algorithm` (None = the process default) on this group."""
    name = _default_algorithm if algorithm is None else algorithm
    if name != "auto":  # an explicit choice needs no process group to answer
        return algorithm_for("", tensor.device.type, name)
    return algorithm_for(dist.get_backend(group), tensor.device.type, name)


def algorithm_for(backend: str, device_type: str = "cpu", algorithm: str | None = None) -> str:
    """"native" or "ring" for a backend and device, without a group (what an estimate assumes)."""
    name = _default_algorithm if algorithm is None else algorithm
    if name == "auto":
        return "ring" if device_type == "cpu" and backend == "gloo" else "native"
    _check_algorithm(name)
    return name


def ring_reduce_scatter(output: torch.Tensor | Sequence[torch.Tensor], input: torch.Tensor | Sequence[torch.Tensor],
                        group: Group = None, async_op: bool = False, op=ReduceOp.SUM):
    """Reduce `input` (N * output.numel() elements) over `group`; chunk `rank` lands in `output`.

    Or coalesced, lists of the same length (module docstring): input i (N * output i's elements)
    reduced into output i, all in one ring. Returns None, or with async_op a RingWork to wait()
    on before reading the output. A collective: every rank of `group` calls it, in the same
    order as its other collectives.
    """
    if op not in _COMBINE:
        raise ValueError(f"ring reduce_scatter reduces with SUM, PRODUCT, MIN or MAX, got {op}")
    outputs = [output] if isinstance(output, torch.Tensor) else list(output)
    inputs = [input] if isinstance(input, torch.Tensor) else list(input)
    n = dist.get_world_size(group)
    if len(inputs) != len(outputs) or any(x.numel() != o.numel() * n for o, x in zip(outputs, inputs)):
        raise ValueError(f"reduce_scatter: inputs of {[x.numel() for x in inputs]} elements, expected {n} x "
                         f"{[o.numel() for o in outputs]}")
    return dispatch(lambda: _ring(outputs, inputs, op, group), outputs[0], group, async_op)


def _span(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> torch.Tensor | None:
    """The outputs as one flat tensor, if they lie end to end in one storage that no input shares."""
    first = outputs[0]
    storage = first.untyped_storage().data_ptr()
    offset = first.storage_offset()
    for o in outputs:
        if not o.is_contiguous() or o.untyped_storage().data_ptr() != storage or o.storage_offset() != offset:
            return None
        offset += o.numel()
    if any(x.untyped_storage().data_ptr() == storage for x in inputs):
        return None
    return first.as_strided((offset - first.storage_offset(),), (1,))


def _ring(outputs: list[torch.Tensor], inputs: list[torch.Tensor], op, group: Group) -> None:
    """The N-1 steps of the module docstring, on the calling thread."""
    n, sizes = dist.get_world_size(group), [o.numel() for o in outputs]
    k = sum(sizes)
    if k == 0:
        return
    pieces = [x.reshape(-1).split(size) for x, size in zip(inputs, sizes)]  # pieces[i][j]: input i's chunk j
    combine = _COMBINE[op]

    def chunk(j: int) -> torch.Tensor:  # rank j's chunk: one input's as it lies, several copied end to end
        return pieces[0][j] if len(pieces) == 1 else torch.cat([p[j] for p in pieces])

    def reduce_into(acc: torch.Tensor, j: int) -> None:  # acc op= rank j's chunk, piece by piece, in place
        for a, p in zip(acc.split(sizes), pieces):
            combine(a, p[j])

    span = _span(outputs, inputs)
    out = span if span is not None else torch.empty(k, dtype=inputs[0].dtype, device=inputs[0].device)
    if n == 1:
        out.copy_(chunk(0))
    else:
        r = dist.get_rank(group)
        right, left = global_rank(group, (r + 1) % n), global_rank(group, (r - 1) % n)
        scratch = [torch.empty_like(out) for _ in range(min(2, n - 2))]
        send = chunk((r - 1) % n)
        for s in range(n - 1):
            recv = out if s == n - 2 else scratch[s % 2]  # never the buffer being sent
            works = (dist.isend(send, right, group=group, tag=_TAG), dist.irecv(recv, left, group=group, tag=_TAG))
            for w in works:
                w.wait()
            reduce_into(recv, (r - 2 - s) % n)
            send = recv
    if span is None:
        for o, piece in zip(outputs, out.split(sizes)):
            o.copy_(piece.view_as(o))


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group: Group = None, async_op: bool = False):
    """Every rank's `input` into chunk `rank` of `output` (N * input.numel() elements), received in place.

    The same ring the other way round: at step s rank r sends chunk (r - s) mod N (its own at
    step 0, then the one it just received) to r+1 and receives chunk (r-1-s) mod N from r-1
    straight into its slot of `output`: (N-1) alpha + S (N-1)/N beta, as gloo's all_gather, but
    without gloo's staging copy of the whole output (ProcessGroupGloo gathers into a fresh flat
    buffer, then copies it out). `input` may be `output`'s own chunk (nothing to copy then).
    """
    n = dist.get_world_size(group)
    if output.numel() != input.numel() * n or not output.is_contiguous():
        raise ValueError(f"all_gather: output must be contiguous with {n} x {input.numel()} elements, "
                         f"got {output.numel()}")
    return dispatch(lambda: _gather_ring(output, input, group), output, group, async_op)


def _gather_ring(output: torch.Tensor, input: torch.Tensor, group: Group) -> None:
    n, k = dist.get_world_size(group), input.numel()
    chunks = output.view(-1).split(k)
    r = dist.get_rank(group)
    if chunks[r].data_ptr() != input.data_ptr():
        chunks[r].copy_(input.reshape(-1))
    right, left = global_rank(group, (r + 1) % n), global_rank(group, (r - 1) % n)
    for s in range(n - 1):
        works = (dist.isend(chunks[(r - s) % n], right, group=group, tag=_TAG + 1),
                 dist.irecv(chunks[(r - 1 - s) % n], left, group=group, tag=_TAG + 1))
        for w in works:
            w.wait()


