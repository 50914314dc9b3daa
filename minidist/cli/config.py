"""Typed schemas for every Hydra config group (composition: minidist.cli.compose); the strategy group's
are the strategies' own (minidist.strategies: each record names its schema).

The yaml files under configs/ say *which values* a preset uses; the dataclasses
here say *which keys exist and what type each has*. Each yaml file starts with

    defaults:
      - /schema/strategy/ddp@_here_

so Hydra merges it onto its schema: an unknown key or a value of the wrong type
fails at composition, before any process group exists, instead of deep inside
training. compose.compose_config() turns Hydra's multi-line errors into one line
that names the key and what would have been valid.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

from minidist import strategies
from minidist.models.gpt import GPTConfig
from minidist.runtime import BACKENDS

_PACKAGE_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = (_PACKAGE_ROOT / "configs" if (_PACKAGE_ROOT / "configs" / "config.yaml").is_file()
              else _PACKAGE_ROOT.parent / "configs")
"""The yaml presets: minidist/configs inside an installed wheel (a copy of the checkout's
top-level configs/, see pyproject.toml), else the checkout's configs/ itself."""


class Precision(enum.Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class WandbMode(enum.Enum):
    offline = "offline"
    disabled = "disabled"
    online = "online"


Backend = enum.Enum("Backend", {b: b for b in BACKENDS})
"""minidist.runtime.BACKENDS as a config type: auto, gloo, nccl."""


# -------------------------------------------------------------------- model
@dataclass
class GPTModel(GPTConfig):
    """minidist.models.GPT, a byte-level decoder-only transformer (fields: GPTConfig's)."""

    name: str = "gpt"
    """Model name (set by the preset)."""


@dataclass
class ResNetModel:
    """torchvision resnet18 adapted to 32x32 images: 3x3 stem, no max-pool."""

    name: str = "resnet18"
    """Model name (set by the preset)."""
    num_classes: int = 10
    """Output classes."""


# --------------------------------------------------------------------- data
@dataclass
class StdlibData:
    """This interpreter's own standard library source and docs, as bytes: always there."""

    source: str = "stdlib"
    """Data source (set by the preset)."""
    max_bytes: int = 4_000_000
    """Cap on the corpus size; files are taken in a fixed order (a hash of their path) until it is reached."""
    val_percent: int = 5
    """Percent of files (chosen by a hash of their path) held out for validation."""


@dataclass
class Cifar10Data:
    """CIFAR-10 through torchvision (downloaded if allowed and online)."""

    source: str = "cifar10"
    """Data source (set by the preset)."""
    root: str = "data/cifar10"
    """Directory holding (or to receive) cifar-10-batches-py."""
    download: bool = True
    """Try to download when root does not hold the data."""
    augment: bool = True
    """Random crop (pad 4) and horizontal flip on training images."""


@dataclass
class SyntheticData:
    """Generated on the fly: learnable random tokens or images, for tests and benchmarks."""

    source: str = "synthetic"
    """Data source (set by the preset)."""
    train_samples: int = 4096
    """Samples in the training split."""
    val_samples: int = 512
    """Samples in the validation split."""
    seed: int = 1234
    """Seed of the generating process (same on every rank)."""


# -------------------------------------------------------------------- optim
@dataclass
class AdamWOptim:
    """torch.optim.AdamW with linear warmup then cosine decay."""

    name: str = "adamw"
    """Optimizer name (set by the preset)."""
    lr: float = 3e-3
    """Peak learning rate, reached after warmup_steps."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam's moment decay rates."""
    eps: float = 1e-8
    """Adam's denominator epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay."""
    warmup_steps: int = 50
    """Steps of linear warmup from 0 to lr."""
    min_lr_ratio: float = 0.1
    """Cosine decays lr to lr * min_lr_ratio at the last step."""
    fused: bool = True
    """torch's fused AdamW kernel (torch.optim.AdamW(fused=True)): one pass over each parameter instead of about
    ten elementwise kernels per parameter. The main job's model (40 tensors, 0.64M parameters) steps in 0.45 ms
    instead of 1.9-2.3 ms on one quiet CPU thread (alternating rounds; 1.0-1.4 ms instead of 5-10 ms on a loaded
    one). false: torch's per-tensor loop (foreach=False)."""


@dataclass
class SGDOptim:
    """torch.optim.SGD with momentum, linear warmup then cosine decay."""

    name: str = "sgd"
    """Optimizer name (set by the preset)."""
    lr: float = 0.1
    """Peak learning rate."""
    momentum: float = 0.9
    """Momentum factor."""
    nesterov: bool = True
    """Nesterov momentum."""
    weight_decay: float = 5e-4
    """L2 weight decay."""
    warmup_steps: int = 50
    """Steps of linear warmup."""
    min_lr_ratio: float = 0.0
    """Final lr as a fraction of the peak."""


# ------------------------------------------------------------------ trainer
@dataclass
class TrainerConfig:
    """The training loop."""

    steps: int = 600
    """Optimizer steps in the run."""
    batch_size: int = 16
    """Samples per rank per micro-batch (global batch = batch_size * grad_accum * world)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradients are reduced only on the last one)."""
    microbatches: int = 1
    """With strategy.pp_size > 1: pieces each rank's batch is cut into for the pipeline schedule (must divide
    batch_size; more = a smaller bubble, (p-1)/(m+p-1)); 1 = no micro-batching."""
    precision: Precision = Precision.fp32
    """fp32, bf16 or fp16: the engines' parameter (compute) and gradient-reduction dtype, fp32 masters and
    optimizer state, autocast around the forward; fp16 adds loss scaling (ShardedGradScaler)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    log_interval: int = 10
    """Steps between log lines / metrics rows (one of them also traces its collectives)."""
    eval_interval: int = 200
    """Steps between validation passes (0: only at the end)."""
    eval_batches: int = 20
    """Validation micro-batches per rank at intermediate evaluations (the final one uses all)."""
    eval_stride: int = 0
    """GPT: validation windows start every min(eval_stride, block_size) tokens; each token is scored once, after
    the first window with at least block_size - stride tokens of context (0 or >= block_size: windows that do not
    overlap, the first token of each scored from nothing). Costs block_size / stride times the forward passes."""
    ckpt_interval: int = 100
    """Steps between checkpoints (0: none); the end of a run also writes <run>/model.pt."""
    keep_last: int = 2
    """Complete checkpoints to keep."""
    seed: int = 0
    """Seed of the model init, the data order and every RNG."""
    sample_bytes: int = 200
    """Length of the text sample printed at the end (GPT only; 0 disables)."""
    progress_bar: bool = True
    """tqdm bar on rank 0."""
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGINT"])
    """Signals that make the run checkpoint after the current step and exit 75 (requeue), e.g. [SIGTERM,SIGUSR1];
    SIGINT is Ctrl-C (a second one stops at once, without a checkpoint)."""


@dataclass
class WandbLogger:
    """Weights & Biases. Each null field follows wandb's own environment variable, as in any
    wandb script, and else minidist's default: offline files under <run dir>/wandb."""

    mode: Optional[WandbMode] = None
    """offline (files only), disabled, or online; null = $WANDB_MODE, else offline."""
    project: Optional[str] = None
    """W&B project; null = $WANDB_PROJECT, else minidist."""
    dir: Optional[str] = None
    """Parent of the wandb/ directory; null = $WANDB_DIR, else the run directory."""
    entity: Optional[str] = None
    """W&B entity (team or user); null = $WANDB_ENTITY, else your default."""
    tags: list[str] = field(default_factory=list)
    """Run tags."""


# --------------------------------------------------------------------- root
@dataclass
class RunConfig:
    """Top level: the groups plus where the run lives."""

    strategy: Any = MISSING
    """Parallelism: one of the registered strategies (minidist.strategies; the choices: `--help`'s config groups)."""
    model: Any = MISSING
    """gpt or resnet18."""
    data: Any = MISSING
    """stdlib, cifar10 or synthetic."""
    optim: Any = MISSING
    """adamw or sgd."""
    trainer: Any = MISSING
    """The loop: steps, batch, precision, intervals."""
    logger: Any = MISSING
    """wandb settings."""
    name: Optional[str] = None
    """Run name; output goes to <out_dir>/<name>. null = <model>-<strategy>-<timestamp> (rank 0's clock).
    An existing run's name needs resume=auto (or resume=<checkpoint>): runs never mix."""
    out_dir: str = "outputs"
    """Parent directory of run directories."""
    resume: str = "never"
    """'never' (a new run), 'auto' (the run's latest complete checkpoint, if any; without a name: the latest
    run of the same config under out_dir) or a checkpoint directory."""
    backend: Backend = Backend.auto
    """Process-group backend: auto (nccl with CUDA, else gloo), gloo or nccl."""
    timeout_s: float = 300.0
    """Seconds any collective may wait before the run fails (naming the collective and the missing ranks)."""
    debug_collectives: bool = False
    """Before every collective, check that all ranks issue the same one (op, shapes, dtype, group, sequence):
    one extra small all_gather each. Also MINIDIST_DEBUG_COLLECTIVES=1."""


GROUPS: dict[str, dict[str, type]] = {
    "model": {"gpt": GPTModel, "resnet18": ResNetModel},
    "data": {"stdlib": StdlibData, "cifar10": Cifar10Data, "synthetic": SyntheticData},
    "optim": {"adamw": AdamWOptim, "sgd": SGDOptim},
    "trainer": {"default": TrainerConfig},
    "logger": {"wandb": WandbLogger},
}
"""Every config group but strategy, its choices and their schemas."""


def groups() -> dict[str, dict[str, type]]:
    """Every config group, its choices and their schemas: the strategy group's are the registered
    strategies' (minidist.strategies), read now, so that one registered later is a choice too."""
    return {"strategy": {r.name: r.schema for r in strategies.records()}} | GROUPS
