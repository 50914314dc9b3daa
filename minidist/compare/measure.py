"""Run one strategy on this rank: the trainer's model, data and wrappers, a few measured steps.

    raw = measure_strategy(cfg, strategy_cfg, topo, train_ds, recorder)

The same composition as training (minidist.train.parallelize: build_layout, parallelize,
build_optimizer; minidist.train.task for the model and its loss; BatchStream for this rank's
data), the same seed, so every strategy starts from the same weights and reads the same
batches. Per strategy:

  warm-up    cfg.warmup_steps untimed steps: DDP rebuilds its buckets in gradient order after
             the first, FSDP learns its unit order (prefetch starts on the second), AdamW
             allocates its state;
  measured   cfg.steps steps inside minidist.comm.trace() with phase and wait timestamps
             (StepRecorder), after one barrier; no other synchronisation;
  memory     one more step under MemoryLedger (slower, so never timed).

The step is the trainer's: forward (the task's loss), backward, clip, optimizer step,
zero_grad(set_to_none=True); the batch is fetched outside the phases.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Callable, ContextManager

import torch
import torch.distributed as dist

from minidist import Topology, comm
from minidist.compare.memory import MemoryLedger, roles_of
from minidist.compare.recorder import StepRecorder
from minidist.mesh import dp_rank, dp_size
from minidist.train.data import BatchStream
from minidist.train.parallelize import build_layout, build_optimizer, clip_grad_norm_, parallelize
from minidist.train.task import make_task

PhaseFn = Callable[[str], ContextManager]


class Bench:
    """One strategy set up on this rank: mesh, wrapped model, optimizer, data stream."""

    def __init__(self, cfg, strategy_cfg, topo: Topology, train_ds):
        self.cfg, self.topo = cfg, topo
        self.mesh = build_layout(strategy_cfg, topo)
        torch.manual_seed(cfg.trainer.seed)
        self.task = make_task(cfg.model)
        model, self.blocks = self.task.build()
        self.model = parallelize(model.to(topo.device), self.mesh, strategy_cfg, self.blocks)
        self.optimizer = build_optimizer(self.model, self.mesh, strategy_cfg, cfg.optim)
        self.stream = BatchStream(train_ds, cfg.trainer.batch_size, dp_rank(self.mesh), dp_size(self.mesh),
                                  cfg.trainer.seed)
        self.bf16 = cfg.trainer.precision.value == "bf16"

    def batch(self) -> list[torch.Tensor]:
        return [b.to(self.topo.device, non_blocking=True) for b in next(self.stream)]

    def step(self, batch: list[torch.Tensor], phase: PhaseFn) -> None:
        """One optimizer step in three phases, as minidist.train.trainer.train_step (grad_accum 1)."""
        clip = self.cfg.trainer.grad_clip
        with phase("forward"), torch.autocast(self.topo.device.type, torch.bfloat16, enabled=self.bf16):
            loss = self.task.loss(self.model, batch)
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            if clip > 0:
                clip_grad_norm_(self.model, clip, self.mesh, self.optimizer)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def bucket_numels(self) -> list[int]:
        engine = getattr(self.optimizer, "engine", None)  # ZeRO: its buckets (padded)
        if engine is not None:
            return engine.buffer_numels()
        reducer = getattr(self.model, "reducer", None)
        return [b.flat.numel() for b in reducer.buckets] if reducer is not None else []


def no_phase(_name: str) -> ContextManager:
    return contextlib.nullcontext()


def measure_strategy(cfg, strategy_cfg, topo: Topology, train_ds, rec: StepRecorder) -> dict:
    """Warm up, measure, then measure memory; returns this rank's raw results (plain JSON)."""
    name = strategy_cfg.name
    bench = Bench(cfg, strategy_cfg, topo, train_ds)
    for _ in range(cfg.warmup_steps):
        bench.step(bench.batch(), no_phase)
    rec.strategy = name
    batches = [bench.batch() for _ in range(cfg.steps)]
    dist.barrier()
    with comm.trace() as tr, rec.recording_waits():
        for i, batch in enumerate(batches):
            bench.step(batch, lambda phase, i=i: rec.phase(phase, i))
    records = rec.records(tr, topo.backend)
    memory = measure_memory(bench) if cfg.memory else None
    raw = {"strategy": name, "rank": topo.rank, "world": topo.world_size, "backend": topo.backend,
           "device": topo.device.type,
           "mesh": {"dims": list(bench.mesh.mesh_dim_names or ()), "shape": list(bench.mesh.mesh.shape)},
           "records": records, "phases": [p for p in rec.phases if p[0] == name],
           "waits": [w for w in rec.waits if w[0] == name], "memory": memory,
           "bucket_numels": bench.bucket_numels()}
    del bench
    gc.collect()
    return raw


def measure_memory(bench: Bench) -> dict:
    """Peak live tensor bytes of one step, by role (see minidist.compare.memory)."""
    batch = bench.batch()
    ledger = MemoryLedger(roles_of(bench.model, bench.optimizer))

    @contextlib.contextmanager
    def phase(name: str):
        ledger.phase = name
        yield

    with ledger:
        bench.step(batch, phase)
    return {"total": ledger.peak.total, "by_role": ledger.peak.by_role, "where": ledger.peak.where}
