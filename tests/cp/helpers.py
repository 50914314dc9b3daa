"""What the context-parallel tests share: a small GPT whose block_size cuts into 2 cp chunks at cp = 2
and 4, the "cp" mesh over the pool's ranks, q, k, v and batches every rank draws alike, and the
reference: full causal attention (torch's scaled_dot_product_attention) on one process."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from minidist.cp import Chunking, Rotate, positions
from minidist.mesh import CP

CFG = dict(vocab_size=32, block_size=32, n_layer=2, n_head=4, n_embd=32)
VARIANTS = [(rotate, chunking) for rotate in Rotate for chunking in Chunking]
"""Every way to run context-parallel attention: ring or all_gather, contiguous or zigzag."""


def cp_mesh():
    """A 1-D "cp" mesh over every rank of the pool."""
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=(CP,))


def qkv(batch: int = 2, heads: int = 3, seq: int = 16, dim: int = 8, seed: int = 0, dtype=torch.float64):
    """Whole-sequence q, k, v (batch, heads, seq, dim), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, dim, generator=g, dtype=dtype) for _ in range(3)]


def full_attention(q, k, v, dout):
    """One process on the whole sequence: (out, dq, dk, dv) of causal attention."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def mine(x: torch.Tensor, chunking: Chunking, dim: int = 2) -> torch.Tensor:
    """This rank's tokens of a whole-sequence tensor."""
    return x.index_select(dim, positions(x.shape[dim], dist.get_world_size(), dist.get_rank(), chunking))


def batches(n: int, batch: int = 4, seq: int = 32, vocab: int = CFG["vocab_size"], seed: int = 1):
    """n (idx, targets) pairs of whole sequences, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
            for _ in range(n)]
