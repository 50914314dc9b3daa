"""Ring attention: the keys and values travel around the cp ranks, the queries stay.

cp ranks, group rank r, each holding its tokens' q, k, v (batch, heads, s/cp, head_dim).
A "block" is one of k or v for a rank's tokens: b (s/cp) h e bytes (h = heads * head_dim).

    forward, step t = 0 .. cp-1: I hold the k, v of rank src = r - t (mod cp)
        post   send (k, v) to r+1, receive the next (k, v) from r-1      (not at the last step)
        compute my queries against src's keys, merged into my running (out, lse)   (online_softmax)
        wait   for the messages: they travelled while I computed
    -> 2 (cp-1) blocks sent per rank and layer

    backward, the same tour again (nothing of it was kept: keeping it would cost the whole
    sequence's k, v per rank, which is what context parallelism avoids). At step t >= 1 I also
    receive from r-1 the gradient dk, dv of src's block summed over the ranks it visited so far,
    add my part and pass it on to r+1; after step cp-1 it reaches its owner, which adds it to
    the part it computed itself at step 0:
        (cp-1) sends of (k, v) + (cp-1) sends of (dk, dv)  ->  4 (cp-1) blocks per rank and layer

Every message goes through minidist.comm.batch_isend_irecv (so comm.trace records it and the
kernel's byte counters see it on gloo's sockets): each rank posts its send to r+1 and its receive
from r-1 together, so no rank waits on another to receive first. Keys travel with tag KV and
their gradients with tag GRAD: two messages of the same size between the same ranks must not
be confused.

Where the causal structure saves work (minidist.cp.chunks): a chunk pair whose keys are all in
the future is skipped. With contiguous chunks, rank r skips every step with src > r (it still
passes the blocks on); with zigzag every rank computes the same: step 0 its own chunks, then
either both its query chunks against src's first chunk (src < r) or its second query chunk
against both of src's (src > r): half of a block pair each time.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm
from minidist.cp import blocks
from minidist.cp.chunks import Chunking

KV, GRAD = 1, 2
"""Message tags: a block of keys and values, a block of their gradients."""


def _exchange(send: torch.Tensor, recv: torch.Tensor, group: dist.ProcessGroup, tag: int) -> list:
    """Post `send` to the next rank and a receive into `recv` from the previous one; the Works."""
    r, n = dist.get_rank(group), dist.get_world_size(group)
    return comm.batch_isend_irecv([comm.P2POp(comm.isend, send, (r + 1) % n, group, tag),
                                   comm.P2POp(comm.irecv, recv, (r - 1) % n, group, tag)])


def _wait(works: list) -> None:
    for w in works:
        w.wait()


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's q, k, v over the whole sequence of the cp ring (module docstring)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                chunking: Chunking) -> torch.Tensor:
        r, n = dist.get_rank(group), dist.get_world_size(group)
        kv = torch.stack([k, v])  # one message per step, contiguous
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for step in range(n):
            last = step == n - 1
            nxt = kv if last else torch.empty_like(kv)
            works = [] if last else _exchange(kv, nxt, group, KV)
            blocks.forward(blocks.Pairs.of(n, r, (r - step) % n, chunking), q, kv[0], kv[1], out, lse)
            _wait(works)
            kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.chunking = group, chunking
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        group, chunking = ctx.group, ctx.chunking
        r, n = dist.get_rank(group), dist.get_world_size(group)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])
        mine = torch.zeros_like(kv)  # the gradient of my own block: my part now, the others' at the end
        passing = None  # the gradient of the block I hold, summed over the ranks it visited
        for step in range(n):
            last = step == n - 1
            nxt = kv if last else torch.empty_like(kv)
            works = [] if last else _exchange(kv, nxt, group, KV)
            arriving = torch.empty_like(kv) if step >= 2 else None
            if step >= 2:  # the previous block's gradient on to r+1, this block's from r-1
                works += _exchange(passing, arriving, group, GRAD)
            part = mine if step == 0 else torch.zeros_like(kv)
            blocks.backward(blocks.Pairs.of(n, r, (r - step) % n, chunking), dout, delta, q, lse, kv[0], kv[1],
                            dq, part[0], part[1])
            _wait(works)
            if step > 0:  # step 0's part is my own block's gradient: it stays in `mine`
                passing = part if arriving is None else part.add_(arriving)
            kv = nxt
        if n > 1:  # the last block's gradient goes home: r+1 owns it
            home = torch.empty_like(kv)
            _wait(_exchange(passing, home, group, GRAD))
            mine.add_(home)
        return dq, mine[0], mine[1], None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                   chunking: Chunking = Chunking.ZIGZAG) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), causal) v for this rank's tokens, keys and values from the whole cp ring.

    q, k, v: (batch, heads, local tokens, head_dim), the local tokens laid out by `chunking`.
    A collective over `group` (forward and backward), differentiable in q, k and v.
    """
    return RingAttention.apply(q, k, v, group, chunking)
