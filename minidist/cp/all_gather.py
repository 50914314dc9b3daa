"""The simple variant, kept for comparison: gather every rank's keys and values, attend, scatter the gradients.

    forward   all_gather (k, v) over cp: every rank holds the whole sequence's keys and values,
              then attends its queries to each rank's block (the same chunk pairs and online-softmax
              merge as the ring, minidist.cp.blocks), and keeps the gathered k, v for backward
    backward  the gradients of every rank's k, v computed here, then reduce_scatter: each rank
              receives the sum for its own block

Bytes per rank and layer (block = b (s/cp) h e): the all_gather sends 2 (cp-1) blocks, as the
ring's forward; the reduce_scatter (minidist.comm's ring on gloo) 2 (cp-1), half the ring's
backward, which sends the keys and values around a second time instead of keeping them.
What it costs instead: the whole sequence's k and v on every rank from forward to backward
(cp times the ring's), and no overlap: attention starts when the all_gather has finished.
Torch's context_parallel gathers the same way by default (its "allgather" rotate method).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm
from minidist.cp import blocks
from minidist.cp.chunks import Chunking


class AllGatherAttention(torch.autograd.Function):
    """Causal attention of this rank's q, k, v over the whole sequence, by all_gather (module docstring)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                chunking: Chunking) -> torch.Tensor:
        r, n = dist.get_rank(group), dist.get_world_size(group)
        kv = torch.stack([k, v])
        every = torch.empty(n, *kv.shape, dtype=kv.dtype, device=kv.device)
        comm.all_gather(every.view(-1), kv.view(-1), group=group, algorithm="auto")  # in place (comm.ring)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for src in range(n):
            blocks.forward(blocks.Pairs.of(n, r, src, chunking), q, every[src, 0], every[src, 1], out, lse)
        ctx.save_for_backward(q, every, out, lse)
        ctx.group, ctx.chunking = group, chunking
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, every, out, lse = ctx.saved_tensors
        r, n = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        dq, d_every = torch.zeros_like(q), torch.zeros_like(every)
        for src in range(n):
            blocks.backward(blocks.Pairs.of(n, r, src, ctx.chunking), dout, delta, q, lse, every[src, 0],
                            every[src, 1], dq, d_every[src, 0], d_every[src, 1])
        mine = torch.empty_like(every[0])
        comm.reduce_scatter(mine, d_every, group=ctx.group)
        return dq, mine[0], mine[1], None, None


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                         chunking: Chunking = Chunking.ZIGZAG) -> torch.Tensor:
    """What minidist.cp.ring_attention computes, by one all_gather of k, v (module docstring). A collective."""
    return AllGatherAttention.apply(q, k, v, group, chunking)
