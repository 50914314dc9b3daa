"""The checker's models and data: small, uneven on purpose, the same on every rank for one seed.

Uneven sizes (13 inputs, 37 hidden, 29 vocabulary rows) make flat buffers, buckets and row
shards split unevenly over 2 or 4 ranks, where off-by-one mistakes show. The DDP model's layers
can sleep in backward (emulated accelerator compute: a sleep takes time, not a core, as a GPU
kernel would), each sleep a named window of torch's profiler, so that the checker can read
whether a collective started before backward was over.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def my_slice(batch: torch.Tensor) -> torch.Tensor:
    """This rank's equal, contiguous part of a batch."""
    k = batch.shape[0] // dist.get_world_size()
    return batch[dist.get_rank() * k:(dist.get_rank() + 1) * k]


class _BackwardSleep(torch.autograd.Function):
    """Identity; its backward sleeps inside the profiler window `check:backward <layer>`."""

    @staticmethod
    def forward(ctx, x, seconds: float, layer: int):
        ctx.seconds, ctx.layer = seconds, layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        from torch.profiler import record_function
        with record_function(f"check:backward {ctx.layer}"):
            time.sleep(ctx.seconds)
        return grad, None, None


class MLP(nn.Module):
    """Linear layers with tanh between; with `seconds`, each layer's backward sleeps that long."""

    def __init__(self, dims=(13, 37, 37, 37, 5), seconds: float = 0.0):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.seconds = seconds

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if self.seconds:
                x = _BackwardSleep.apply(x, self.seconds, i)
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def mlp(seed: int, **kw) -> MLP:
    torch.manual_seed(seed)
    return MLP(**kw)


class TokenNet(nn.Module):
    """Embedding, Linears, a LayerNorm and a head: 29 and 11 rows do not split evenly over 2 or 4 ranks."""

    def __init__(self, vocab: int = 29, width: int = 12, depth: int = 1):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.mids = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, 11)
        self.norm = nn.LayerNorm(11)
        self.head = nn.Linear(11, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for mid in self.mids:
            x = torch.tanh(mid(x))
        return self.head(self.norm(torch.tanh(self.out(x))))


def token_net(seed: int, **kw) -> TokenNet:
    torch.manual_seed(seed)
    return TokenNet(**kw)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def tokens(n: int, seed: int, vocab: int = 29) -> tuple[torch.Tensor, torch.Tensor]:
    """n sequences of 5 tokens and their targets."""
    return (torch.randint(0, vocab, (n, 5), generator=seeded(seed)),
            torch.randint(0, vocab, (n, 5), generator=seeded(seed + 1)))


def psi(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
