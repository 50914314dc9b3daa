"""Typed schema of configs/compare.yaml, the strategy comparison (composition: minidist.cli.compose).

The comparison reuses the training groups (model, data, optim, trainer) and every registered
strategy (minidist.strategies) under strategy_options.<name>, on its own schema with its
defaults, so `strategy_options.hybrid_shard.shard_size=1` or `strategy_options.ddp.bucket_cap_mb=1`
is checked like any training override. Its default rows, and which rows can take tensor
parallelism, are the records' (default_rows, tp_rows): a strategy registered before composing
is a row like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from minidist import strategies
from minidist.cli.config import Backend
from minidist.compare.plan_table import PlanConfig, check_plan
from minidist.compare.rows import check_rows
from minidist.strategies.ddp import DDP_RECORD
from minidist.strategies.schema import DType

REFERENCE = DDP_RECORD.name
"""The row whose bytes the others are shown as a multiple of (DDP's: the all_reduce every strategy is measured
against)."""


@dataclass
class ClusterConfig:
    """A cluster for the projection (minidist.compare.projection): alpha-beta numbers, not a measurement."""

    gpus_per_node: int = 8
    """Ranks per node: inside a node they talk over the intra-node fabric."""
    intra_alpha_us: float = 2.0
    """Latency per hop inside a node (NVLink / NVSwitch), microseconds."""
    intra_GBps: float = 450.0
    """Bandwidth per GPU inside a node, one direction, GB/s (NVLink 4: 900 GB/s both directions)."""
    net_alpha_us: float = 8.0
    """Latency per hop between nodes (NIC, switch, software), microseconds."""
    nic_GBps: float = 50.0
    """Bandwidth per NIC, one direction, GB/s (400 Gb/s = 50 GB/s)."""
    nics_per_node: int = 8
    label: str = ""


def _default_clusters() -> dict[str, ClusterConfig]:
    return {"h100_ib_8x400g": ClusterConfig(label="8 GPUs per node, NVLink 450 GB/s, 8 x 400 Gb/s InfiniBand"),
            "gpu_eth_2x100g": ClusterConfig(net_alpha_us=25.0, nic_GBps=12.5, nics_per_node=2,
                                            label="8 GPUs per node, NVLink 450 GB/s, 2 x 100 Gb/s Ethernet")}


@dataclass
class ProjectionConfig:
    """Communication per step at many ranks (minidist.compare.projection)."""

    ranks: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256, 512, 1024])
    """Rank counts to predict."""
    params: float = 7.5e9
    """A second model, given by its parameter count (ZeRO's 7.5B example), projected on the clusters."""
    layers: int = 32
    """Its FSDP units (transformer blocks)."""
    tokens_per_rank: int = 8192
    """Its tokens per rank per step: compute = 6 params tokens / (peak x efficiency), 1/3 forward, 2/3 backward."""
    seq: int = 2048
    """Its tokens per sequence (activations: tokens_per_rank / seq sequences per rank)."""
    precision: str = "bf16"
    """fp32, bf16 or fp16 (with fp32 masters): the bytes moved, the memory and the compute rate alike."""
    gpu: str = "h100"
    """h100, h200 or a100: the dense peak FLOP/s at the precision (minidist.precision.PEAK_FLOPS)."""
    efficiency: float = 0.4
    """The share of that peak the kernels reach (bf16 on an H100: about 396 TFLOP/s)."""
    bucket_cap_mb: float = 25.0
    """DDP's and ZeRO's bucket on the calibrated link; on a GPU cluster the bucket rule's (compare.pricing)."""
    clusters: dict[str, ClusterConfig] = field(default_factory=_default_clusters)
    """Named clusters; the measured model is projected on this machine's calibrated link only."""
    devices_GB: list[float] = field(default_factory=lambda: [80.0, 141.0])
    """Device memory sizes a rank's memory is checked against (H100 80 GB, H200 141 GB)."""


@dataclass
class EstimateConfig:
    """`--estimate`: predicted per-rank peak memory, no process group, nothing runs."""

    worlds: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 64])
    """World sizes to tabulate."""
    dtype: DType = DType.fp32
    """Dtype of parameters, gradients and optimizer state (the model of `model=`, activations included)."""
    device: str = "cpu"
    """Device whose kernels (and so activations) are assumed: cpu or cuda."""
    params: Optional[float] = None
    """A bare parameter count instead of `model=`: ZeRO's model states only, in GB (no activations)."""
    precision: str = "bf16"
    """With params: the run's precision (minidist.precision.RunPrecision): bf16 or fp16 (p = g = 2, and K = 12
    of fp32 Adam state: master weights, momentum, variance; "mixed" is the ZeRO paper's name for fp16) or fp32
    (p = g = 4, K = 8)."""
    gpus_per_node: int = 8
    """Processes per node of the machine estimated: hybrid_shard's shard group where its shard_size is null,
    as at runtime (a group larger than a tabulated world is that whole world)."""


def default_rows() -> list[str]:
    """The records' default rows, in the registry's order; the tensor-parallel ones last."""
    records = strategies.records()
    return ([r.name for r in records if 1 in r.default_rows]
            + [f"{r.name}+tp{t}" for r in records for t in r.default_rows if t > 1])


def registered_options() -> dict[str, Any]:
    """Every strategy that can be a row, its config at its schema's defaults (what strategy=<name> composes)."""
    return {r.name: r.preset() for r in strategies.records() if r.comparable}


@dataclass
class CompareConfig:
    """Top level of configs/compare.yaml."""

    strategies: list[str] = field(default_factory=default_rows)
    """Rows to run, in order: a key of strategy_options (data parallelism over every rank), or
    `<strategy>+tp<T>` (tensor parallelism of degree T inside, the strategy over the N / T
    data-parallel ranks: the trainer's strategy.tp_size=T), e.g. `ddp+tp2` (at world 2 pure TP,
    dp = 1) or `full_shard+tp2` (at world 4, dp 2 x tp 2). T must divide the world and the
    model's heads and width; the preset's own sequence_parallel / vocab_parallel apply. Or
    `<strategy>+cp<C>` (context parallelism of degree C: the trainer's strategy.cp_size=C, the engine
    over all N ranks, dp x cp), e.g. `ddp+cp2`; the preset's cp_chunking / cp_rotate apply. Or
    `<strategy>+pp<P>` (pipeline parallelism of degree P: the trainer's strategy.pp_size=P with
    trainer.microbatches=pp_microbatches, the engine over each stage's N / P data-parallel ranks), e.g.
    `ddp+pp2` or `full_shard+pp2` (at world 4, dp 2 x pp 2); the preset's pp_schedule / pp_virtual apply.
    Default: every registered strategy's default rows (minidist.strategies); model=resnet18's: the
    rows without tensor parallelism (configs/compare_model/resnet18.yaml)."""
    pp_microbatches: int = 4
    """Micro-batches of every `+pp<P>` row (its trainer.microbatches): they divide its pipeline's P x
    trainer.batch_size sequences; the bubble is (P-1)/(m+P-1) of the step for 1F1B and GPipe."""
    strategy_options: Any = field(default_factory=registered_options)
    """Every registered strategy but single, by name, on its schema (strategy_options.<name>.<key>=...)."""
    model: Any = MISSING
    data: Any = MISSING
    """stdlib (the default: tokens), synthetic or cifar10; synthetic for model=resnet18 when none is named."""
    optim: Any = MISSING
    trainer: Any = MISSING
    """The training groups; trainer.batch_size, grad_clip, precision and seed are used."""
    warmup_steps: int = 2
    """Untimed steps per strategy before measuring (>= 2: one-time work happens in the second step)."""
    steps: int = 5
    """Measured steps per strategy."""
    memory: bool = True
    """Measure peak memory on one extra step per strategy."""
    replay_repeats: int = 5
    """Times each collective of a step is run again alone (time alone, bandwidth)."""
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    estimate: EstimateConfig = field(default_factory=EstimateConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    name: Optional[str] = None
    """Run name; outputs go to <out_dir>/<name>. null = compare-<timestamp>."""
    out_dir: str = "outputs"
    backend: Backend = Backend.auto
    timeout_s: float = 300.0


def check(cfg) -> None:
    """Rules the schema cannot express; raises ValueError (one line)."""
    check_rows(cfg)
    if cfg.steps < 1 or cfg.warmup_steps < 2:
        raise ValueError("steps must be >= 1 and warmup_steps >= 2: DDP rebuilds its buckets (a broadcast) in the "
                         "second step's forward, FSDP starts prefetching in the second step")
    if cfg.estimate.precision not in ("fp32", "bf16", "fp16", "mixed"):
        raise ValueError(f"estimate.precision={cfg.estimate.precision!r}: choose fp32 (p = g = 4, K = 8), bf16 or "
                         f"fp16 (p = g = 2, K = 12 with fp32 masters; mixed: the ZeRO paper's name for fp16)")
    if cfg.estimate.gpus_per_node < 1:
        raise ValueError(f"estimate.gpus_per_node={cfg.estimate.gpus_per_node} must be >= 1")
    check_plan(cfg.plan, cfg.projection.clusters)
    if cfg.projection.precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"projection.precision={cfg.projection.precision!r}: choose fp32, bf16 or fp16")
    if cfg.replay_repeats < 1:
        raise ValueError("replay_repeats must be >= 1")
    if cfg.model.name == "gpt" and cfg.data.source == "cifar10":
        raise ValueError("model=gpt reads tokens, not data=cifar10's images: use data=stdlib or data=synthetic")
    if cfg.model.name != "gpt" and cfg.data.source == "stdlib":
        raise ValueError(f"model={cfg.model.name} reads images, not data=stdlib's text: use data=synthetic (generated, "
                         f"the default with this model) or data=cifar10")
