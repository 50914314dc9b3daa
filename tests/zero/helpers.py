"""The training loop shared by the ZeRO tests: the same data and steps for the one-process
reference (a plain torch optimizer on the whole batch) and for ShardedOptimizer on rank slices."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.common import MLP, rank_slice


def fresh_mlp(hidden: int = 41, depth: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return MLP(hidden=hidden, depth=depth)


def two_groups(model: nn.Module) -> list[dict]:
    """Weights decay, biases do not and learn twice as fast: two groups with their own hyperparameters."""
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.1},
            {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0, "lr": 0.02}]


def train(model: nn.Module, opt, data, *, shard: bool, micro: int = 1, sync_every_micro: bool = False,
          sched=None, clip: float | None = None) -> list[float]:
    """K steps of MSE; shard=True feeds each rank its slice. Returns the clipped norms (if clip).

    micro > 1 splits each batch in `micro` pieces, each loss divided by micro: the first micro-1
    backwards run inside opt.no_sync() unless sync_every_micro (then every backward reduces and
    the partition gradients accumulate).
    """
    norms = []
    for x, y in data:
        if shard:
            x, y = rank_slice(x), rank_slice(y)
        opt.zero_grad()
        for k, (xs, ys) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
            local = shard and not sync_every_micro and k < micro - 1
            with opt.no_sync() if local else contextlib.nullcontext():
                (F.mse_loss(model(xs), ys) / micro).backward()
        if clip is not None:
            norms.append(float(opt.clip_grad_norm_(clip) if shard else
                               torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        if sched is not None:
            sched.step()
    return norms


def max_diff(a: nn.Module, b: nn.Module) -> float:
    pb = dict(b.named_parameters())
    return max((p.float() - pb[n].float()).abs().max().item() for n, p in a.named_parameters())
