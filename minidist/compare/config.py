"""Typed schema of configs/compare.yaml, the strategy comparison (composition: minidist.train.compose).

The comparison reuses the training groups (model, data, optim, trainer) and every strategy
preset under strategy_options.<name> (configs/strategy/*.yaml, each on its own schema), so
`strategy_options.hybrid_shard.shard_size=1` or `strategy_options.ddp.bucket_cap_mb=1` is
checked like any training override.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from minidist.train.config import GROUPS, Backend, DType


@dataclass
class InterconnectProfile:
    """A class of link for the projection: alpha-beta numbers, not a measurement."""

    alpha_us: float = 5.0
    """Latency per message (per ring or tree step), microseconds."""
    bandwidth_GBps: float = 50.0
    """Bytes per second one rank sends over one link, in GB/s (beta = 1 / bandwidth)."""


def _default_profiles() -> dict[str, InterconnectProfile]:
    return {"nvlink": InterconnectProfile(alpha_us=3.0, bandwidth_GBps=450.0),
            "infiniband_400g": InterconnectProfile(alpha_us=5.0, bandwidth_GBps=50.0),
            "ethernet_100g": InterconnectProfile(alpha_us=25.0, bandwidth_GBps=12.5)}


@dataclass
class ProjectionConfig:
    """Communication per step at many ranks (minidist.compare.projection)."""

    ranks: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256, 512, 1024])
    """Rank counts to predict."""
    params: float = 7.5e9
    """A second model to project, given by its parameter count (ZeRO's 7.5B example)."""
    layers: int = 32
    """Its FSDP units (transformer blocks)."""
    bytes_per_param: int = 2
    """Its bytes per parameter on the wire (bf16 gradients and gathered parameters)."""
    tokens_per_rank: int = 8192
    """Its tokens per rank per step: compute = 6 * params * tokens / flops_per_s."""
    flops_per_s: float = 4.0e14
    """Achieved FLOP/s per rank (about 40% of a 1 PFLOP/s bf16 accelerator)."""
    ranks_per_node: int = 8
    """Ranks sharing the intra-node links; also hybrid_shard's shard group."""
    bucket_cap_mb: float = 25.0
    """DDP bucket size assumed for the second model."""
    intra_node: str = "nvlink"
    """Profile of the links inside a node (a key of profiles)."""
    profiles: dict[str, InterconnectProfile] = field(default_factory=_default_profiles)
    """Named link classes; the calibrated alpha and beta of this machine are always added."""


@dataclass
class EstimateConfig:
    """`--estimate`: predicted per-rank peak memory, no process group, nothing runs."""

    worlds: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 64])
    """World sizes to tabulate."""
    dtype: DType = DType.fp32
    """Dtype of parameters, gradients and optimizer state."""
    device: str = "cpu"
    """Device whose kernels (and so activations) are assumed: cpu or cuda."""


@dataclass
class CompareConfig:
    """Top level of configs/compare.yaml."""

    strategies: list[str] = field(default_factory=lambda: ["ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op",
                                                           "full_shard", "hybrid_shard"])
    """Strategies to run, in order (keys of strategy_options)."""
    strategy_options: Any = MISSING
    """Every strategy preset, by name (configs/strategy/<name>.yaml on its schema)."""
    model: Any = MISSING
    data: Any = MISSING
    optim: Any = MISSING
    trainer: Any = MISSING
    """The training groups; trainer.batch_size, grad_clip, precision and seed are used."""
    warmup_steps: int = 2
    """Untimed steps per strategy before measuring (>= 2: one-time work happens in the second step)."""
    steps: int = 5
    """Measured steps per strategy."""
    memory: bool = True
    """Measure peak memory on one extra step per strategy."""
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    estimate: EstimateConfig = field(default_factory=EstimateConfig)
    name: Optional[str] = None
    """Run name; outputs go to <out_dir>/<name>. null = compare-<timestamp>."""
    out_dir: str = "outputs"
    backend: Backend = Backend.auto
    timeout_s: float = 300.0


def check(cfg) -> None:
    """Rules the schema cannot express; raises ValueError (one line)."""
    valid = [s for s in GROUPS["strategy"] if s != "single"]
    unknown = [s for s in cfg.strategies if s not in valid]
    if unknown or not cfg.strategies:
        raise ValueError(f"strategies={list(cfg.strategies)}: {', '.join(unknown) or 'empty'} not valid; "
                         f"choose from {', '.join(valid)}")
    if cfg.steps < 1 or cfg.warmup_steps < 2:
        raise ValueError("steps must be >= 1 and warmup_steps >= 2: DDP rebuilds its buckets (a broadcast) in the "
                         "second step's forward, FSDP starts prefetching in the second step")
    p = cfg.projection
    if p.intra_node not in p.profiles:
        raise ValueError(f"projection.intra_node={p.intra_node!r} is not one of projection.profiles: "
                         f"{', '.join(p.profiles)}")
    if cfg.model.name == "gpt" and cfg.data.source == "cifar10" or cfg.model.name != "gpt" and cfg.data.source == "stdlib":
        raise ValueError(f"model={cfg.model.name} cannot read data={cfg.data.source}")
