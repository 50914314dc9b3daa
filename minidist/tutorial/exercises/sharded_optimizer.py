"""The owner-broadcast variant of ZeRO-1 (CS336's exercise, torch's ZeroRedundancyOptimizer).

    model = FlatDDP(module)                  # DDP averages the gradients first (any rung 1-4)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss.backward(); model.finish_gradient_synchronization(); opt.step()

Each parameter, whole, gets one owner rank (the least-loaded rank so far, in elements); only the
owner keeps its optimizer state and updates it; after the step each parameter is broadcast from
its owner. Per step, on top of DDP's all_reduce, each rank receives the (N-1)/N of the parameters
it does not own: 1.5x DDP's bytes in all. The largest share is the average plus at most one
parameter, so the state per rank is at most 8 (psi / N + the largest parameter) bytes for AdamW.

The checker (python -m minidist.tutorial.check sharded_optimizer mine.py) holds you to:
  * K steps equal torch's optimizer on one process (two groups, one added after construction,
    an lr scheduler);
  * every parameter's state on exactly one rank;
  * the step writes S (N-1)/N bytes per rank on average (kernel-counted);
  * the construction and first step leave at most 8 (psi / N + largest parameter) bytes allocated
    per rank (torch's MemTracker).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls: type, **kwargs: Any):
        """Remember optimizer_cls and kwargs, then super().__init__(params, kwargs) (it calls add_param_group)."""
        raise NotImplementedError("ShardedOptimizer.__init__")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """super().add_param_group(param_group); give each parameter an owner; hand this rank's to the
        wrapped optimizer, with the group's hyperparameters."""
        raise NotImplementedError("ShardedOptimizer.add_param_group")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any):
        """Copy hyperparameters inwards, step this rank's share, broadcast every parameter from its owner."""
        raise NotImplementedError("ShardedOptimizer.step")
