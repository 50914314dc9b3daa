"""What the pipeline tests share: small models every rank builds alike, their data, the one-process
reference, and a pipeline over a given mesh dimension."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

from minidist import pp
from minidist.models.gpt import GPT
from tests.common import seeded, tiny_gpt_config

STEPS = 2


def gpt_config(n_layer: int = 4):
    return tiny_gpt_config(n_layer=n_layer)


def gpt(n_layer: int = 4) -> GPT:
    torch.manual_seed(0)
    return GPT(gpt_config(n_layer))


def token_batches(steps: int = STEPS, batch: int = 8, seed: int = 5) -> list[torch.Tensor]:
    """(batch, block_size + 1) token ids per step: inputs are [:, :-1], targets [:, 1:]."""
    g = seeded(seed)
    return [torch.randint(0, 31, (batch, 17), generator=g) for _ in range(steps)]


def mlp(depth: int = 8, width: int = 12) -> nn.Sequential:
    """Blocks of Linear + tanh, named "0", "1", ...: an untied model cut at any block."""
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict((str(i), nn.Sequential(nn.Linear(width, width), nn.Tanh()))
                                     for i in range(depth)))


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target)


def vector_batches(steps: int = STEPS, batch: int = 8, width: int = 12, seed: int = 7):
    g = seeded(seed)
    return [(torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)) for _ in range(steps)]


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference_gpt(batches, n_layer: int = 4, opt=sgd) -> dict[str, torch.Tensor]:
    """The whole GPT trained in one process on the whole batches: every name, tied ones included."""
    model = gpt(n_layer)
    optim = opt(model.parameters())
    for b in batches:
        optim.zero_grad()
        model(b[:, :-1], b[:, 1:])[1].backward()
        optim.step()
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


def reference_mlp(batches, opt=sgd, **kw) -> dict[str, torch.Tensor]:
    model = mlp(**kw)
    optim = opt(model.parameters())
    for x, y in batches:
        optim.zero_grad()
        mse(model(x), y).backward()
        optim.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def max_diff(stages, reference: dict[str, torch.Tensor]) -> float:
    """Largest |parameter - reference| over this rank's stages, by the whole model's names."""
    return max((p.detach() - reference[n]).abs().max().item() for s in stages for n, p in s.module.named_parameters())


def pipeline(cut: pp.Cut, schedule: pp.Schedule, mesh, rank: int, wrap=None) -> pp.Pipeline:
    """This rank's stages of `cut` (wrap(module) -> (runner, sync) where an engine runs them) in a Pipeline."""
    stages = []
    for s in schedule.stages_of(rank):
        runner, sync = wrap(cut.modules[s]) if wrap else (None, None)
        stages.append(pp.Stage(cut.modules[s], s, cut.num_stages, runner=runner, sync=sync))
    return pp.Pipeline(stages, schedule, mesh, cut.loss_fn or mse, ties=cut.ties)


def train(pipe: pp.Pipeline, batches, gpt_data: bool, opt=sgd, optimizer=None, clip: float | None = None, layout=None):
    """K steps of `pipe` on `batches`; returns the losses the last stage saw (None elsewhere)."""
    optim = optimizer or opt(pipe.parameters())
    losses = []
    for b in batches:
        x, y = (b[:, :-1], b[:, 1:]) if gpt_data else b
        optim.zero_grad()
        losses.append(pipe.step(x, target=y))
        if clip is not None:
            pp.clip_grad_norm_(pipe, clip, layout)
        optim.step()
    return losses
