"""A step's collectives again, alone: one at a time, each after a barrier, repeated (as nccl-tests time).

    alone = replay(records_of_one_step, trace.groups, device, repeats=5)
    alone["calls"][i]["seconds"]     # every repeat's time of call i on this rank

Why: what a step's communication costs with nothing to overlap it and no peer to wait for is
what the step must hide (minidist.comm.trace.hidden_share's `comm`) and what the cost model
predicts; and per op it gives the bandwidth nccl-tests would report: algbw = S / t, busbw =
algbw x (2(n-1)/n all_reduce; (n-1)/n all_gather, reduce_scatter; 1 broadcast, reduce).

How: every rank issues the same collectives as the step did (op, payload, dtype, group, root,
reduce_scatter algorithm) in the same order, on fresh buffers allocated before any timing. Each
call follows a barrier of its group and is timed alone, blocking (on CUDA up to a synchronize);
`repeats` rounds. The caller combines ranks as nccl-tests do by default: the mean over ranks.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from minidist import comm


def _buffers(rec, device) -> tuple:
    """(input, output) of the shapes the step used for `rec`."""
    dtype = getattr(torch, rec.dtype) if rec.dtype != "-" else torch.float32
    n = rec.group_size
    if rec.op in ("all_gather", "gather"):
        return torch.ones(rec.numel // n, dtype=dtype, device=device), torch.empty(rec.numel, dtype=dtype, device=device)
    if rec.op in ("reduce_scatter", "scatter"):
        return torch.ones(rec.numel, dtype=dtype, device=device), torch.empty(rec.numel // n, dtype=dtype, device=device)
    if rec.op == "all_to_all":
        return torch.ones(rec.numel, dtype=dtype, device=device), torch.empty(rec.numel, dtype=dtype, device=device)
    return torch.ones(rec.numel, dtype=dtype, device=device), None


def _issue(rec, group, x, y) -> None:
    me = dist.get_rank(group) if group is not None else dist.get_rank()
    if rec.op == "all_reduce":
        comm.all_reduce(x, group=group)
    elif rec.op == "all_gather":
        comm.all_gather(y, x, group=group)
    elif rec.op == "reduce_scatter":
        comm.reduce_scatter(y, x, group=group, algorithm=rec.algorithm)
    elif rec.op == "broadcast":
        comm.broadcast(x, group=group, group_src=rec.root)
    elif rec.op == "reduce":
        comm.reduce(x, group=group, group_dst=rec.root)
    elif rec.op == "all_to_all":
        comm.all_to_all(y, x, group=group)
    elif rec.op == "gather":
        comm.gather(x, list(y.chunk(rec.group_size)) if me == rec.root else None, group=group, group_dst=rec.root)
    elif rec.op == "scatter":
        comm.scatter(y, list(x.chunk(rec.group_size)) if me == rec.root else None, group=group, group_src=rec.root)
    elif rec.op == "barrier":
        comm.barrier(group=group)


def replay(records, groups: dict, device: torch.device, repeats: int) -> dict:
    """Time each of `records` alone, `repeats` times (module docstring). Plain JSON."""
    group = lambda r: None if r.group == "world" else groups[r.group]  # noqa: E731
    bufs = [_buffers(r, device) for r in records]
    seconds = [[] for _ in records]
    for _ in range(repeats):
        for i, r in enumerate(records):
            g = group(r)
            dist.barrier(group=g)
            start = time.perf_counter()
            _issue(r, g, *bufs[i])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds[i].append(time.perf_counter() - start)
    return {"calls": [{"op": r.op, "wire_op": r.wire_op or r.op, "payload_bytes": r.payload_bytes,
                       "group_size": r.group_size, "seconds": s} for r, s in zip(records, seconds)]}
