"""What is being learned: next-byte prediction (GPT) or image classification (ResNet).

A task builds the model, turns a batch into a loss, and sums validation
statistics so that ranks can add theirs up with one all_reduce.
"""

from __future__ import annotations

import dataclasses

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from minidist.train.data import IGNORE


class LanguageModeling:
    unit = "tokens"

    def __init__(self, model_cfg):
        self.cfg = model_cfg

    def build(self) -> tuple[nn.Module, tuple[type, ...]]:
        from minidist.models import GPT, Block, GPTConfig
        c = self.cfg
        fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(GPTConfig)}
        return GPT(GPTConfig(**fields)), (Block,)

    @staticmethod
    def count(batch) -> int:
        return batch[1].numel()

    @staticmethod
    def loss(model: nn.Module, batch) -> torch.Tensor:
        return model(batch[0], batch[1])[1]

    @staticmethod
    def eval_sums(model: nn.Module, batch) -> torch.Tensor:
        """[summed loss in nats, tokens] on the model's device (NCCL reduces device tensors only).

        The model's own loss (its criterion, fp32 under autocast): under vocabulary parallelism each
        rank's logits are its slice of the vocabulary, and only the model's loss sees all of them.
        """
        _, loss = model(batch[0], batch[1])
        n = (batch[1] != IGNORE).sum().double()  # the loss is the mean over the scored targets (TokenWindows)
        return torch.stack([loss.detach().double() * n, n.to(loss.device)])

    @staticmethod
    def report(sums: torch.Tensor) -> dict[str, float]:
        loss = float(sums[0] / sums[1])
        return {"val/loss": loss, "val/bits_per_byte": loss / math.log(2)}


class Classification:
    unit = "samples"

    def __init__(self, model_cfg):
        self.cfg = model_cfg

    def build(self) -> tuple[nn.Module, tuple[type, ...]]:
        from minidist.models.resnet import BasicBlock, resnet18_cifar
        return resnet18_cifar(self.cfg.num_classes), (BasicBlock,)

    @staticmethod
    def count(batch) -> int:
        return len(batch[1])

    @staticmethod
    def loss(model: nn.Module, batch) -> torch.Tensor:
        return F.cross_entropy(model(batch[0]), batch[1])

    @staticmethod
    def eval_sums(model: nn.Module, batch) -> torch.Tensor:
        """[summed loss, samples, correct]."""
        logits = model(batch[0]).float()
        loss = F.cross_entropy(logits, batch[1], reduction="sum")
        correct = (logits.argmax(-1) == batch[1]).sum()
        return torch.stack([loss.detach().double(), loss.new_tensor(len(batch[1]), dtype=torch.float64),
                            correct.double()])

    @staticmethod
    def report(sums: torch.Tensor) -> dict[str, float]:
        return {"val/loss": float(sums[0] / sums[1]), "val/accuracy": float(sums[2] / sums[1])}


def make_task(model_cfg):
    return LanguageModeling(model_cfg) if model_cfg.name == "gpt" else Classification(model_cfg)
