"""A model's parameters by size: what every estimate of its memory and its communication is made of.

    shape = ModelShape.from_units(model, build_units(model, wrap_predicate({Block})))   # a real (or meta) model
    shape = ModelShape.uniform(7.5e9, layers=32)                                        # a model known by its size

Nothing here knows a strategy or an engine's schedule: the engines' footprints
(minidist.footprint) and the strategies' collective plans (minidist.strategies) read
the sizes and decide what their engine holds and sends. The units are FSDP's (root
first, then each wrapped block in forward order): DDP and ZeRO ignore them except to
know when, in backward, a parameter's gradient is ready.

FSDP splits every parameter by rows (dim 0): a parameter of R rows and C elements per
row is padded to whole rows per rank, so its bytes on the wire depend on R and C, not
only on R x C (param_rows). A model known only by its size has no rows: each unit is
then one flat buffer, and ZeRO's owner-broadcast shares are taken equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn as nn


def param_rows(shape) -> tuple[int, int]:
    """(rows, elements per row) of a parameter: dim 0 is what FSDP splits (a 0-dim one is one row)."""
    rows = shape[0] if len(shape) else 1
    return rows, (math.prod(shape) // rows if rows else math.prod(shape[1:]))


@dataclass(frozen=True)
class ModelShape:
    """The sizes (elements) of a model's parameters, per FSDP unit and in model order."""

    unit_param_numels: tuple[tuple[int, ...], ...]
    """Per FSDP unit (root first), the elements of each of its parameters in the unit's order."""
    param_numels: tuple[int, ...]
    """Every parameter once, in model.parameters() order (DDP's and ZeRO's buckets)."""
    param_units: tuple[int, ...]
    """The unit of each parameter of param_numels."""
    itemsize: int = 4
    """Bytes per parameter element, as the model was built."""
    unit_param_rows: tuple[tuple[tuple[int, int], ...], ...] = ()
    """Per unit, each parameter as (rows, elements per row): FSDP splits dim 0. Empty: unknown
    shapes (a model known only by its size), each parameter taken as one column of numel rows."""

    @classmethod
    def from_units(cls, model: nn.Module, units) -> ModelShape:
        """The shape of `model` under FSDP's unit assignment `units` (minidist.fsdp.api.build_units's)."""
        unit_of = {id(info.param): u for u, (_, _, infos) in enumerate(units) for info in infos}
        params = list(model.parameters())
        return cls(unit_param_numels=tuple(tuple(i.param.numel() for i in infos) for _, _, infos in units),
                   param_numels=tuple(p.numel() for p in params),
                   param_units=tuple(unit_of.get(id(p), 0) for p in params),
                   itemsize=params[0].element_size(),
                   unit_param_rows=tuple(tuple(param_rows(i.param.shape) for i in infos) for _, _, infos in units))

    @classmethod
    def uniform(cls, psi: float, layers: int, itemsize: int = 4) -> ModelShape:
        """A model of psi parameters in `layers` equal units of one parameter each (no root, no rows)."""
        per_layer = int(psi // layers)
        return cls(((per_layer,),) * layers, (per_layer,) * layers, tuple(range(layers)), itemsize)

    def rows(self, unit: int) -> tuple[tuple[int, int], ...]:
        """(rows, elements per row) of each parameter of `unit`."""
        if self.unit_param_rows:
            return self.unit_param_rows[unit]
        return tuple((n, 1) for n in self.unit_param_numels[unit])

    @property
    def shapes_known(self) -> bool:
        """Whether the parameters' rows are known (a real model), or only their sizes."""
        return bool(self.unit_param_rows)

    @property
    def psi(self) -> int:
        return sum(self.param_numels)

    @property
    def units(self) -> int:
        return len(self.unit_param_numels)

    @property
    def unit_numels(self) -> tuple[int, ...]:
        """Elements per unit, root first."""
        return tuple(sum(u) for u in self.unit_param_numels)
