"""Training loops shared by the DDP (and ZeRO) tests: the same data and steps for the
single-process reference, minidist.DDP and torch's DistributedDataParallel."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.common import rank_slice, seeded

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def batches(steps: int, batch: int, d_in: int, d_out: int, seed: int = 7):
    g = seeded(seed)
    return [(torch.randn(batch, d_in, generator=g), torch.randn(batch, d_out, generator=g)) for _ in range(steps)]


def train(model: nn.Module, opt_name: str, data, *, shard: bool, micro: int = 1, no_sync=None) -> nn.Module:
    """K optimizer steps of MSE on `data`; shard=True feeds each rank its slice.

    micro > 1 splits each (per-rank) batch into `micro` pieces: the first micro-1
    run under `no_sync` (a context-manager factory), each loss scaled by 1/micro.
    """
    opt = OPTIMIZERS[opt_name]([p for p in model.parameters() if p.requires_grad])
    for x, y in data:
        if shard:
            x, y = rank_slice(x), rank_slice(y)
        opt.zero_grad(set_to_none=True)
        xs, ys = x.chunk(micro), y.chunk(micro)
        for k in range(micro):
            ctx = no_sync() if (k < micro - 1 and no_sync is not None) else _null()
            with ctx:
                (F.mse_loss(model(xs[k]), ys[k]) / micro).backward()
        opt.step()
    return model


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def max_diff(a: nn.Module, b: nn.Module) -> float:
    pa = dict(a.named_parameters())
    pb = dict(b.named_parameters())
    assert pa.keys() == pb.keys(), (pa.keys(), pb.keys())
    return max((pa[k] - pb[k]).abs().max().item() for k in pa)


def unwrap(m: nn.Module) -> nn.Module:
    return m.module if hasattr(m, "module") else m
