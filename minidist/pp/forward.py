"""Forward only through a pipeline: evaluation, stage after stage, nothing kept for a backward.

    loss = forward_loss(pipe, x, target)    # the last stage's rank: loss_fn(output, target); else None

No schedule is needed: without backwards there is nothing to interleave, so the whole batch goes
through stage 0, 1, ..., S-1 in order, each rank computing its stages when their input arrives
(from the rank of the previous stage, or from itself under interleaving: stage s on rank s mod p).
Every message is preceded by its header (dtype, shape): evaluation batches are few, and the
last one may be shorter. Call it under torch.no_grad(); every rank of the pipeline passes the
same batch (the first stage reads x, the last the target).
"""

from __future__ import annotations

import torch

from minidist import comm
from minidist.pp.runtime import HEADER, TAG, Pipeline, _header, _unheader


def forward_loss(pipe: Pipeline, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
    """The model's loss on (x, target) on the rank of the last stage, None on the others."""
    sched, group, me = pipe.schedule, pipe.group, pipe.rank
    out = None
    for s in range(sched.num_stages):
        here, before = sched.rank_of(s), sched.rank_of(s - 1) if s else None
        if here != me:
            if before == me:  # the next stage is elsewhere: hand it the output
                _send(out, here, group)
            continue
        if s == 0:
            inp = x
        elif before == me:
            inp = out
        else:
            inp = _recv(before, group, pipe.device)
        out = pipe.stages[s](inp)
    last = sched.num_stages - 1
    return pipe.loss_fn(out, target) if sched.rank_of(last) == me else None


def _send(t: torch.Tensor, dst: int, group) -> None:
    t = t.detach().contiguous()
    for work in (comm.isend(_header(t).to(t.device), dst, group=group, tag=TAG),
                 comm.isend(t, dst, group=group, tag=TAG)):
        work.wait()


def _recv(src: int, group, device: torch.device) -> torch.Tensor:
    header = torch.zeros(HEADER, dtype=torch.int64, device=device)
    comm.irecv(header, src, group=group, tag=TAG).wait()
    shape, dtype = _unheader(header.cpu())
    t = torch.empty(shape, dtype=dtype, device=device)
    comm.irecv(t, src, group=group, tag=TAG).wait()
    return t
