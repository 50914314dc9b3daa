"""The engine contract: what the training loop, the checkpoints and the composition may call on an engine.

A strategy's record says which contract the object its wrap_model returns offers (model_engine)
and which the object its build_optimizer returns offers (optimizer_engine); None is a plain
module, a plain torch optimizer. The loop and the checkpoints ask the record, never the object
(no hasattr probing, no isinstance):

    contract                 offered by                     called by
    ModelWrapper             minidist.DDP                   parallel.unwrap (.module), parallel.no_sync
    ShardedModel             minidist.FSDP                  + parallel.full_state_dict, train.checkpoint,
                                                              parallel.portable (whole and sharded state)
    ShardedOptimizerState    minidist.ShardedOptimizer      parallel.no_sync, parallel.clip_grad_norm_
                                                              (its gradient pieces), train.checkpoint

Nothing here is inherited: the engines match these shapes structurally (typing.Protocol), and
tests/strategies/test_contract.py holds every registered record's engines to its contract.
The memory side of an engine (what it holds at each instant, its live tensors) is the
minidist.footprint interface, reached through the record's `held`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch
import torch.nn as nn


class ModelWrapper(Protocol):
    """A model engine: the user's model inside, and a gradient synchronisation an accumulation step skips."""

    module: nn.Module
    """The user's model (its parameters are this rank's shards under a sharding engine)."""

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Backwards inside accumulate locally; the next synced backward reduces the sum."""


class ShardedModel(ModelWrapper, Protocol):
    """A model engine whose parameters live in per-rank shards: whole and sharded state dicts (collectives)."""

    def full_state_dict(self, rank0_only: bool = True, cpu_offload: bool = True) -> dict[str, torch.Tensor]:
        """The whole model's state (on rank 0 of its group only, with rank0_only)."""

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        """Cut whole tensors into this rank's shards."""

    def sharded_state_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """This rank's shards, and the optimizer state that belongs to them."""

    def load_sharded_state_dict(self, shards: list[dict[str, Any]],
                                optimizer: torch.optim.Optimizer | None = None) -> None:
        """Every saved rank's shards (any world size) into this rank's, the optimizer's too."""


class ShardedOptimizerState(Protocol):
    """An optimizer engine that reduces the gradients itself and keeps its state in per-rank shards."""

    @property
    def parameters_in_order(self) -> list[nn.Parameter]:
        """Every parameter it updates, in the order given."""

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Backwards inside accumulate locally; the next synced backward reduces the sum."""

    def grad_pieces(self) -> tuple[list[tuple[nn.Parameter, torch.Tensor]], bool]:
        """This rank's averaged gradients beside their parameters, and whether they are shards of the group."""

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's shard of the state."""

    def load_sharded_state_dict(self, shards: list[dict[str, Any]]) -> None:
        """Every saved rank's shard (any world size) into this rank's."""
