"""What the tensor-parallel tests share: a small GPT whose heads, width, vocabulary and sequence
split over 2 and 4 ranks, the tp mesh over the pool's ranks, and batches every rank draws alike."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from minidist.mesh import TP
from minidist.models.gpt import GPT, GPTConfig
from minidist.tp import parallelize_gpt

CFG = dict(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_embd=32)


def tp_mesh():
    """A 1-D "tp" mesh over every rank of the pool."""
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=(TP,))


def models(seed: int = 0, **overrides) -> tuple[GPT, GPT, dict]:
    """(the plain GPT, a deep copy to parallelize, its config): the same weights on every rank."""
    torch.manual_seed(seed)
    ref = GPT(GPTConfig(**{**CFG, **overrides}))
    return ref, copy.deepcopy(ref), {**CFG, **overrides}


def parallel(model: GPT, **plan) -> GPT:
    return parallelize_gpt(model, tp_mesh(), **plan)


def batches(n: int, batch: int = 4, seq: int = 16, vocab: int = CFG["vocab_size"], seed: int = 1):
    """n (idx, targets) pairs, the same on every rank (tp ranks read the same data)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
            for _ in range(n)]
