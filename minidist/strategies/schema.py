"""What every strategy's config schema shares: the dtype type, and tensor and context parallelism inside data
parallelism.

Each record (minidist.strategies.record.Strategy) names its schema, a dataclass whose fields are
the keys `strategy.*` accepts; Hydra merges configs/strategy/<name>.yaml onto it (minidist.cli),
so an unknown key or a wrong type fails at composition. Each field's docstring is what
`--help` prints for it (minidist.cli.help reads them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class DType(enum.Enum):
    """A floating-point dtype by its config name; `.torch_dtype` is the torch one."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.value]


@dataclass
class DataParallelStrategy:
    """What every data-parallel strategy shares: its name, then tensor and context parallelism inside it (the
    layers split over "tp" first, then the sequence over "cp", the engine over the data-parallel ranks that
    remain times cp: minidist.parallel.parallelize)."""

    name: str = ""
    """Strategy name (set by the preset; do not override)."""
    tp_size: int = 1
    """Tensor-parallel degree: ranks per "tp" group, splitting every layer of the GPT (Megatron-LM's layout,
    minidist.tp); must divide the processes and the model's heads; the data-parallel engine spans the rest."""
    sequence_parallel: bool = False
    """With tp_size > 1: split the norms', dropouts' and residuals' activations along the sequence too
    (all_reduce becomes reduce_scatter + all_gather, the same bytes); tp_size must divide model.block_size."""
    vocab_parallel: bool = False
    """With tp_size > 1: split the token embedding and the tied head by vocabulary rows, the loss computed
    from split logits; tp_size must divide model.vocab_size."""
    cp_size: int = 1
    """Context-parallel degree: ranks per "cp" group, each keeping 1/cp of every sequence's tokens (ring
    attention, minidist.cp); the GPT only, without dropout; 2 cp_size (zigzag) or cp_size (contiguous) must
    divide model.block_size. The engine spans dp x cp: cp ranks hold the same weights."""
    cp_chunking: str = "zigzag"
    """With cp_size > 1: zigzag (rank r keeps chunks r and 2 cp-1-r of 2 cp: equal causal work on every rank)
    or contiguous (chunk r of cp: the last rank does 2 - 1/cp times the mean)."""
    cp_rotate: str = "ring"
    """With cp_size > 1: how keys and values reach every rank: ring (point-to-point, one block in flight) or
    all_gather (the whole sequence's keys and values at once: fewer bytes, more memory)."""
    pp_size: int = 1
    """Pipeline-parallel degree: ranks per "pp" group, each holding consecutive blocks of the GPT (minidist.pp,
    outermost); must divide the processes / tp_size and model.n_layer / pp_virtual; the engine spans the rest."""
    pp_schedule: str = "1f1b"
    """With pp_size > 1: gpipe, 1f1b, interleaved_1f1b (pp_virtual stages per rank) or zb_h1 (minidist.pp.schedule)."""
    pp_virtual: int = 1
    """Stages per rank (interleaved_1f1b's v, >= 2 there; 1 for the others): the model is cut into pp_size x v."""
