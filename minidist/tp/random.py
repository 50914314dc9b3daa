"""Dropout under tensor parallelism: which random numbers the tp ranks share, and which they must not.

A dropout on activations every tp rank holds whole (after g, without SP) must draw the same
mask on every rank, or the ranks' copies of the residual stream drift apart. There the ranks
simply share the default generator: seeded alike (minidist's trainer seeds every rank with
the same seed) and drawing in lockstep.

A dropout on what ranks hold different parts of (each rank's heads inside the attention; each
rank's chunk of the sequence under SP) must draw different masks, or rank 1's heads repeat
rank 0's masks. There the plan wraps the dropout in `RankRandom`, which forks the generator:

    seed = one number drawn from the default generator    (the same on every rank; all advance alike)
    with torch.random.fork_rng():  seed the generator with seed + tp rank;  run the dropout

Drawing the fork's seed from the default generator, instead of keeping a second generator per
rank as Megatron-LM's RNG tracker does, lets activation checkpointing work unchanged:
torch.utils.checkpoint restores the default generator before it recomputes a block, so the
recompute draws the same seed and the same masks.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist.tp.placement import tp_group


class RankRandom(nn.Module):
    """Run `module` (parameterless, e.g. a dropout) in training with random numbers of this tp rank's own."""

    def __init__(self, module: nn.Module, device_mesh: DeviceMesh):
        super().__init__()
        if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
            raise ValueError(f"RankRandom wraps parameterless modules only, got {type(module).__name__} with state")
        self.module = module
        self.rank = tp_group(device_mesh)[1]

    def forward(self, *args, **kwargs):
        if not self.training:
            return self.module(*args, **kwargs)
        seed = int(torch.randint(0, 2**62, (1,)))
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
            torch.default_generator.manual_seed(seed + self.rank)
            if cuda:
                torch.cuda.manual_seed(seed + self.rank)
            return self.module(*args, **kwargs)
