"""DDP's memory on one rank, instant by instant (the minidist.footprint interface).

    held(layout, world, policy=ReducerPolicy(), device_type="cpu")   # from sizes: list[Held]
    live(ddp_model)                                                  # the buffers that exist now

DDP is the all_reduce reducer over a replicated model and nothing else: every rank holds
all psi parameters, all their gradients and the optimizer's state for all of them, plus
what the reducer adds (minidist/buckets/footprint.py says what, and when).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.buckets import footprint as reducer_footprint

held = reducer_footprint.held


def live(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """The reducer's flat buffers that exist now ({} for a model that is not a minidist.DDP)."""
    reducer = getattr(model, "reducer", None)
    return {} if reducer is None else reducer_footprint.live(reducer)
