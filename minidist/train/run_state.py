"""What one training run holds between the loop's phases (Run), and what one step reports (StepStats).

minidist.train.trainer builds a Run in setup() and passes it to every phase; minidist.train.finish
ends it; minidist.compare.measure times the trainer's own step on one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from minidist import Topology, comm, strategies
from minidist.mesh import Layout
from minidist.train.checkpoint import Checkpointer
from minidist.train.data import BatchStream
from minidist.train.metrics import NullLogger
from minidist.train.preemption import PreemptionWatch
from minidist.train.run_dir import RunPlan, RunRequest


@dataclass
class Run:
    """Everything one training run holds between phases."""

    cfg: Any
    topo: Topology
    layout: Layout
    """Which ranks do what: data shards, the main process, the groups every sum runs over."""
    plan: RunPlan
    run_dir: Path
    task: Any
    model: torch.nn.Module
    """What forward/backward run on: the user's model inside its wrappers."""
    optimizer: torch.optim.Optimizer
    strategy: strategies.Strategy
    """The strategy's record: which contract its model and optimizer engines offer (minidist.strategies)."""
    stream: BatchStream
    val_stream: BatchStream
    ckpt: Checkpointer
    logger: NullLogger
    info: dict
    preemption: PreemptionWatch | None = None
    scaler: Any = None
    """fp16: the loss scaler (torch's ShardedGradScaler: every rank skips a step with an inf together)."""
    start_step: int = 0
    stop_requested: bool = False
    preempted: bool = False
    window: list = field(default_factory=list)
    """StepStats since the last logged step."""
    t0: float = field(default_factory=time.perf_counter)
    request: RunRequest | None = None
    """What the launcher asked for (the command that continues the run, if it knows one)."""
    local_batch: Callable[[list], list] = lambda batch: batch
    """What this rank computes on of a batch its data shard read: under context parallelism its tokens of
    the same rows (minidist.parallel.parallelize.local_batch), else the batch itself."""

    def request_stop(self) -> None:
        """Checkpoint after the current step and return from train() (resume=auto continues)."""
        self.stop_requested = True

    def autocast(self):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.cfg.trainer.precision.value)
        return torch.autocast(self.topo.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


@dataclass
class StepStats:
    step: int
    """Steps done after this one."""
    loss: torch.Tensor
    """Mean micro-batch loss on this rank, on the device (not read: no host sync)."""
    grad_norm: torch.Tensor | None
    lr: float
    seconds: float
    items: int
    """Tokens or samples the whole job processed in this step."""
    trace: comm.Trace | None
