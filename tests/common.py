"""Helpers shared by the engine tests (DDP, ZeRO, FSDP): small models and data
that every rank builds identically from a seed, and the per-rank slice of a batch."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.distributed as dist


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rank_slice(batch: torch.Tensor, rank: int | None = None, world: int | None = None) -> torch.Tensor:
    """Rows of `batch` that belong to `rank`: contiguous, equal parts (len must divide)."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    assert batch.shape[0] % world == 0, f"batch of {batch.shape[0]} does not split over {world} ranks"
    k = batch.shape[0] // world
    return batch[rank * k:(rank + 1) * k]


class MLP(nn.Module):
    """Uneven layer sizes on purpose: flat buffers and buckets do not split evenly."""

    def __init__(self, d_in: int = 13, hidden: int = 37, d_out: int = 5, depth: int = 3):
        super().__init__()
        dims = [d_in] + [hidden] * (depth - 1) + [d_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


class TiedLM(nn.Module):
    """Embedding and output head share one weight: it must be reduced once."""

    def __init__(self, vocab: int = 29, dim: int = 11):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(torch.tanh(self.mid(self.emb(idx))))


def tiny_gpt_config(**overrides):
    from minidist.models.gpt import GPTConfig
    cfg = dict(vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=18)
    cfg.update(overrides)
    return GPTConfig(**cfg)
