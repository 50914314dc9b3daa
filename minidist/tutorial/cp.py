"""Context parallelism in miniature: ring attention with the online softmax, causal, contiguous chunks.

Split the sequence: rank r of N holds the r-th of N equal, contiguous chunks of the tokens, and
their q, k, v (batch, heads, s/N, d). Everything in a transformer but attention acts token by
token; attention needs every earlier token's key and value. Ring attention (Liu et al. 2023)
keeps the queries where they are and moves the keys and values around the ring: at step t
rank r holds the block of rank src = r - t (mod N), attends its queries to it, and passes it on
to r+1 while receiving the next from r-1. Causal: a block from a later chunk (src > r) is all
future and skipped (it is still passed on); src = r is the diagonal block, masked.

The blocks are merged without ever holding a row's scores over the whole sequence, by the
online softmax (FlashAttention's merge). Each block alone gives its output and the log of its
softmax's sum (lse); two merge exactly:

    lse = log(exp(lse_a) + exp(lse_b))          out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b

Backward recomputes each block's probabilities P = exp(S - lse) from the final lse (nothing of
the forward's tour is kept: that would be the whole sequence's keys and values per rank), with
delta = rowsum(dO * O):

    dV = P^T dO     dS = P * (dO V^T - delta)     dQ = dS K / sqrt(d)     dK = dS^T Q / sqrt(d)

The block's k, v travel around the ring again, this time with their gradients dk, dv, to which
every rank adds its part; after N passes the block is home with its whole gradient. Per rank and
layer: forward N-1 messages of (k, v), 2 (N-1) blocks of b (s/N) h e bytes; backward N messages
of (k, v, dk, dv), 4 N blocks. The real engine (minidist/cp/) sends 4 (N-1) in backward, balances
the causal work with zigzag chunks, and runs inside minidist's GPT.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from minidist import comm


# --8<-- [start:block]
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of queries q against one block of keys and values; `diagonal`: the causal mask."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge(out, lse, block_out, block_lse) -> tuple[torch.Tensor, torch.Tensor]:
    """The online softmax: two blocks' (out, lse) as one."""
    new = torch.logaddexp(lse, block_lse)
    return out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1), new


def attend_backward(dout, delta, q, k, v, lse, diagonal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one block, from the rows' final lse and delta = rowsum(dout * out)."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-2, -1) * scale
    if diagonal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    ds = p * (dout @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ dout
# --8<-- [end:block]


# --8<-- [start:ring]
def pass_on(block: torch.Tensor) -> torch.Tensor:
    """Send `block` to rank r+1 and return the one rank r-1 sends (both posted together: no rank waits first)."""
    r, n = dist.get_rank(), dist.get_world_size()
    arriving = torch.empty_like(block)
    for work in comm.batch_isend_irecv([comm.P2POp(comm.isend, block, (r + 1) % n),
                                        comm.P2POp(comm.irecv, arriving, (r - 1) % n)]):
        work.wait()
    return arriving


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's chunk of queries over every rank's keys and values."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        r, n = dist.get_rank(), dist.get_world_size()
        out, lse = attend(q, k, v, diagonal=True)            # step 0: my own block
        kv = torch.stack([k, v])
        for step in range(1, n):
            kv = pass_on(kv)                                 # now rank r - step's block
            if (r - step) % n < r:                           # a later chunk's keys are all in the future
                out, lse = merge(out, lse, *attend(q, kv[0], kv[1], diagonal=False))
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        r, n = dist.get_rank(), dist.get_world_size()
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        travel = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        for step in range(n):
            src = (r - step) % n
            if src <= r:
                dq_b, dk_b, dv_b = attend_backward(dout, delta, q, travel[0], travel[1], lse, diagonal=src == r)
                dq += dq_b
                travel[2] += dk_b
                travel[3] += dv_b
            travel = pass_on(travel) if n > 1 else travel   # after N passes, the block is home
        return dq, travel[2], travel[3]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), causal) v for this rank's chunk; q, k, v: (batch, heads, s/N, d)."""
    return RingAttention.apply(q, k, v)
# --8<-- [end:ring]
