"""Attention one block of keys at a time: the online softmax (FlashAttention's merge) and its backward.

For one query row q and keys k_1..k_n, attention is sum_j p_j v_j with p_j = exp(x_j) / Z,
x_j = q.k_j / sqrt(d) and Z = sum_j exp(x_j). Split the keys into blocks A and B. Each block
alone gives its own output and the log of its own sum (the log-sum-exp, lse):

    out_A = sum_{j in A} exp(x_j - lse_A) v_j,      lse_A = log sum_{j in A} exp(x_j)

and the whole is recovered exactly from the two, without the scores:

    lse = log(exp(lse_A) + exp(lse_B))    = m + log(exp(lse_A - m) + exp(lse_B - m)),  m = max(lse_A, lse_B)
    out = exp(lse_A - lse) out_A + exp(lse_B - lse) out_B

(each block's output re-weighted by its share of the total sum; subtracting the running
max m keeps every exponent <= 0, which is how FlashAttention merges tiles and ring attention
merges the key/value blocks that visit a rank). Starting from out = 0, lse = -inf, merging
the blocks in any order gives softmax attention over all of them, to rounding.

Backward needs no block's scores either, only the final out and lse of each row. With
P = exp(S - lse) recomputed per block (S = q k^T / sqrt(d), masked), and D = rowsum(dO * out)
computed once:

    dV = P^T dO      dP = dO V^T      dS = P * (dP - D)      dQ = dS K / sqrt(d)     dK = dS^T Q / sqrt(d)

so each block's gradients are computed where the block is, and the key/value gradients
travel back to their owner (minidist.cp.ring).
"""

from __future__ import annotations

import math

import torch


def _scores(q: torch.Tensor, k: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """q k^T / sqrt(d), with the causal mask where q and k are the same chunk (`diagonal`)."""
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if diagonal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu_(1)
        s.masked_fill_(future, float("-inf"))
    return s


def attend_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of queries q (..., Lq, d) against one block of keys and values (..., Lk, d).

    lse has q's shape without its last dimension. `diagonal`: q and k are the same tokens,
    a query sees only the keys at or before it.
    """
    s = _scores(q, k, diagonal)
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def merge_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block's (out, lse) into the running (out, lse), in place (module docstring)."""
    m = torch.maximum(lse, block_lse)  # the running max: every exponent below is <= 0
    new = m + torch.log(torch.exp(lse - m) + torch.exp(block_lse - m))
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(block_out * torch.exp(block_lse - new).unsqueeze(-1))
    lse.copy_(new)


def attend_block_backward(dout: torch.Tensor, delta: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, lse: torch.Tensor, diagonal: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one block, from the rows' final lse and delta = rowsum(dout * out) (module docstring)."""
    p = torch.exp(_scores(q, k, diagonal) - lse.unsqueeze(-1))
    dv = torch.matmul(p.transpose(-2, -1), dout)
    ds = p * (torch.matmul(dout, v.transpose(-2, -1)) - delta.unsqueeze(-1))
    scale = 1.0 / math.sqrt(q.shape[-1])
    return torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-2, -1), q) * scale, dv
