"""What the planner tries: minidist's GPT by its shape, one dp x tp x pp x cp layout of it, and its engine.

A layout is the degrees, the strategy, recompute and the micro-batch; its engine (the strategy's
record, configured with the bucket rule's size, the data-parallel ranks its gradients are reduced
over, its state group and one rank's slice of the model) is what both the memory
(minidist.compare.plan_memory) and the step time (minidist.compare.plan_time) are read from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields as fields_of, replace
from functools import lru_cache

from omegaconf import DictConfig, OmegaConf

from minidist import strategies
from minidist.compare import pricing
from minidist.compare.hardware import Hardware
from minidist.precision import RunPrecision
from minidist.shape import ModelShape
from minidist.strategies.ddp import DDP_RECORD
from minidist.strategies.fsdp import FULL_SHARD, HYBRID_SHARD
from minidist.strategies.zero import ZERO1, ZERO2

STRATEGIES = tuple(r.name for r in (DDP_RECORD, ZERO1, ZERO2, FULL_SHARD, HYBRID_SHARD))
"""The engines a plan tries, one per ZeRO stage and HSDP (their records: minidist.strategies)."""


@dataclass(frozen=True)
class GPTModel:
    """minidist's GPT by its shape: L blocks of width h (12 h^2 + 13 h parameters each), a tied V x h
    embedding, learned positions for `seq` tokens and the final norm (the root unit)."""

    layers: int
    hidden: int
    heads: int
    vocab: int = 50304

    @classmethod
    def of_params(cls, psi: float, layers: int, heads: int | None = None, vocab: int = 50304) -> "GPTModel":
        """The GPT of about psi parameters with `layers` blocks: 12 L h^2 + V h = psi, h rounded to 128; heads
        (unless given) the power of two nearest below h / 128, at most 128, so that every tp up to it divides them."""
        h = (-vocab + math.sqrt(vocab ** 2 + 48 * layers * psi)) / (24 * layers)
        h = max(128, round(h / 128) * 128)
        return cls(layers, h, heads or min(128, 2 ** int(math.log2(h // 128))), vocab)

    @classmethod
    def of_config(cls, cfg) -> "GPTModel":
        return cls(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size)

    def psi(self, seq: int) -> int:
        return self.layers * self.block() + self.root(seq)

    def block(self, tp: int = 1) -> int:
        return (12 * self.hidden ** 2 + 13 * self.hidden) // tp

    def root(self, seq: int, tp: int = 1, vocab_parallel: bool = False) -> int:
        return self.vocab * self.hidden // (tp if vocab_parallel else 1) + seq * self.hidden + 2 * self.hidden

    def shape(self, seq: int, tp: int, pp: int, vocab_parallel: bool, itemsize: int) -> ModelShape:
        """One rank's slice as FSDP units: the root, then the stage's L / pp blocks."""
        units = (self.root(seq, tp, vocab_parallel),) + (self.block(tp),) * (self.layers // pp)
        return ModelShape(tuple((u,) for u in units), units, tuple(range(len(units))), itemsize)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    strategy: str = DDP_RECORD.name
    recompute: str = "none"
    micro_batch: int = 1
    """Sequences per micro-batch on each replica."""
    sequence_parallel: bool = True
    """With tp > 1: sequence parallelism (Megatron's), and the vocabulary split (vocab_parallel) too."""

    @property
    def name(self) -> str:
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} {self.strategy}"
                f"{' +recompute' if self.recompute != 'none' else ''} mb{self.micro_batch}")


def engine(model: GPTModel, lay: Layout, seq: int, precision: RunPrecision, hw: Hardware):
    """(record, its config with the bucket rule's size, the data-parallel ranks, the state group, rank shape)."""
    return _engine_of(model, replace(lay, micro_batch=0, recompute="none"), seq, precision, hw)


@lru_cache(maxsize=4096)  # composing a preset (OmegaConf) costs milliseconds; a plan asks for each many times
def _engine_of(model: GPTModel, lay: Layout, seq: int, precision: RunPrecision, hw: Hardware):
    record = strategies.get(lay.strategy)
    world = lay.dp * lay.cp  # cp ranks hold the same weights: their gradients are reduced with dp's
    fields = {"bucket_cap_mb": pricing.bucket_bytes(hw.node(), world) / pricing.MIB} \
        if hw.link is None and any(f.name == "bucket_cap_mb" for f in fields_of(record.schema)) else {}
    cfg = _preset(record, **fields)
    group = record.state_group(cfg, world, max(1, hw.gpus_per_node // (lay.tp * lay.cp)))
    shape = model.shape(seq, lay.tp, lay.pp, lay.tp > 1 and lay.sequence_parallel, precision.compute_bytes)
    return record, cfg, world, group, shape


@lru_cache(maxsize=256)
def _preset(record: strategies.Strategy, **fields) -> DictConfig:
    """The record's preset (OmegaConf.structured: ~4 ms), read only: a plan's hundreds of engine layouts share a
    handful of strategy and bucket-size pairs."""
    cfg = record.preset(**fields)
    OmegaConf.set_readonly(cfg, True)
    return cfg
