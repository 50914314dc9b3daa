"""Cutting a model into stages: runs of consecutive layers, one per stage, cut the same on every rank.

    cut = split_gpt(GPT(cfg), num_stages=4)            # embeddings + first blocks ... last blocks + head
    cut = split_sequential(net, split_points=[2, 5])   # layers [0, 2), [2, 5), [5, end)
    mine = [Stage(cut.modules[s], s, cut.num_stages) for s in stages_of(rank, pp, virtual)]

Every rank builds the whole model alike (same seed), cuts it, and keeps its own stages (the
others are garbage once dropped), so all stages start from the weights of one model. A stage's
parameters keep their names in the whole model (blocks.3.attn.qkv.weight): its state_dict is
the model's, restricted, and results compare name by name with one process.

Each stage's parameters are declared split over "pp" by whole parameters
(minidist.sharding.shard_param(p, "pp", None)): the stages hold different parameters, so a
gradient norm sums their squared norms over the pipeline (minidist.clip.global_norm).

A weight two stages use (GPT's head is tied to the token embedding) becomes one copy on each
stage's rank; `Cut.ties` names them, and the pipeline sums their gradients after backward so
that both take the same step (Megatron-LM's embedding group; minidist.pp.compose.sync_ties).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from minidist.models.gpt import GPT, head_logits
from minidist.sharding import shard_param

PP = "pp"
"""The mesh dimension of pipeline parallelism (minidist.mesh.PP)."""

GradSync = Callable[[bool], ContextManager[None]]
"""The context a stage's backward runs in, given whether it is the stage's last of the step: where a
data-parallel engine reduces (minidist.pp.compose.gradient_sync), that one reduces, the others only
accumulate."""


@dataclass(frozen=True)
class Tie:
    """One weight used by two stages: (stage, parameter name) of each copy."""

    first: tuple[int, str]
    second: tuple[int, str]


@dataclass
class Cut:
    """A model cut into stages: their modules in order, the weights they share, and the loss."""

    modules: list[nn.Module]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """loss_fn(last stage's output, targets), where the model computes its own loss (GPT)."""
    ties: tuple[Tie, ...] = ()

    @property
    def num_stages(self) -> int:
        return len(self.modules)


@dataclass
class Stage:
    """One stage this rank runs: its layers, where it sits in the pipeline, and what runs it."""

    module: nn.Module
    """The stage's layers (parameters by the whole model's names; under FSDP, its shards)."""
    index: int
    num_stages: int
    runner: nn.Module | None = None
    """What to call: an engine wrapping `module` (minidist.DDP, minidist.FSDP), or None for the module."""
    sync: GradSync | None = field(default=None, repr=False)
    """Which backward reduces the gradients (minidist.pp.compose.gradient_sync); None: no engine."""

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.runner or self.module)(x)


# ------------------------------------------------------------------------------------ GPT
class GPTStage(nn.Module):
    """Some consecutive blocks of a GPT; the first stage adds the embeddings, the last the final norm and head.

    Reads as GPT.forward, cut: the parts are the model's own submodules (a tensor-parallel
    plan's swaps included), under the model's names (blocks is a ModuleDict keyed "3", "4", ...).
    """

    def __init__(self, model: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.cfg, self.first, self.last = model.cfg, first, last
        if first:
            self.wte, self.wpe, self.drop = model.wte, model.wpe, model.drop
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in blocks})
        if last:
            self.ln_f, self.lm_head, self.criterion = model.ln_f, model.lm_head, model.criterion

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """First stage: token ids (batch, time) in; last stage: logits out; activations (batch, time, width) between."""
        if self.first:
            t = x.shape[1]
            if t > self.cfg.block_size:
                raise ValueError(f"sequence of {t} tokens exceeds block_size={self.cfg.block_size}")
            x = self.drop(self.wte(x) + self.wpe(torch.arange(t, device=x.device)))
        recompute = self.cfg.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks.values():
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return head_logits(self.cfg, self.ln_f, self.lm_head, x) if self.last else x


class GPTLoss:
    """GPT's loss on the last stage's logits: its criterion (a vocabulary-parallel plan's, where swapped)."""

    def __init__(self, criterion: nn.Module):
        self.criterion = criterion

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.criterion(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def split_gpt(model: GPT, num_stages: int) -> Cut:
    """`model` cut into `num_stages` stages of consecutive blocks (as even as the blocks allow)."""
    n = model.cfg.n_layer
    if not 1 <= num_stages <= n:
        raise ValueError(f"a GPT of n_layer={n} blocks cuts into 1 to {n} stages (pp x virtual), not {num_stages}")
    bounds = [k * n // num_stages for k in range(num_stages + 1)]
    modules = [GPTStage(model, range(bounds[k], bounds[k + 1]), k == 0, k == num_stages - 1)
               for k in range(num_stages)]
    tied = model.lm_head.weight is model.wte.weight
    ties = (Tie((0, "wte.weight"), (num_stages - 1, "lm_head.weight")),) if tied and num_stages > 1 else ()
    return _declared(Cut(modules, GPTLoss(model.criterion), ties))


def split_sequential(model: nn.Sequential, split_points: list[int], loss_fn=None) -> Cut:
    """An nn.Sequential cut before each layer index of `split_points` (increasing, inside the model)."""
    names = list(model._modules)
    points = [0, *split_points, len(names)]
    if any(a >= b for a, b in zip(points, points[1:])):
        raise ValueError(f"split_points={split_points} must increase strictly between 1 and {len(names) - 1} "
                         f"(the model has {len(names)} layers)")
    modules = [nn.Sequential(OrderedDict((k, model._modules[k]) for k in names[a:b]))
               for a, b in zip(points, points[1:])]
    return _declared(Cut(modules, loss_fn))


def _declared(cut: Cut) -> Cut:
    """Each stage's parameters declared split over "pp" by whole parameters (module docstring)."""
    for module in cut.modules:
        for p in module.parameters():
            shard_param(p, PP, None)
    return cut
