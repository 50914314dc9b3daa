"""Run one strategy on this rank with the trainer's own step: time, bytes, memory.

    raw = measure_strategy(cfg, strategy_cfg, topo, train_ds, t0)

Per strategy, every rank, in this order:

  build      the trainer's composition: minidist.parallel.parallelize (build_layout, parallelize,
             build_optimizer, trainer.precision's policy), the task's model and loss,
             BatchStream; the same seed, weights and batches for every strategy (a
             tensor-parallel row, strategy.tp_size = T: each tp group shares T x
             trainer.batch_size sequences, so every row trains on the same global batch;
             a context-parallel row, cp_size = C: each cp group C x, each rank its tokens; a
             pipeline row, pp_size = P: each pipeline P x, in cfg.pp_microbatches pieces)
  warm-up    cfg.warmup_steps untimed steps: DDP rebuilds its buckets after the first, FSDP
             records its unit order, AdamW allocates its state
  measured   cfg.steps steps of minidist.train.trainer.train_step, inside comm.trace() (bytes,
             issue, completion and wait times) and, on gloo, comm.kernel_io.written() (the bytes
             the kernel saw this process write), alternating with the same steps of the plain
             model (no wrapper, a plain optimizer, the same batches: the step without
             communication), each first in turn and each after a barrier (torch's, untraced; its
             bytes, measured by kernel_io, are taken off the kernel's count). Phase edges come
             from the task's loss (Phased): forward is the loss call, backward runs from the
             loss's gradient to the last end-of-backward callback, optimizer is the rest of the
             step (clip, step, zero_grad)
  alone      the last measured step's collectives again, one at a time (replay.py)
  memory     a fresh build, two warm-up steps and two steps under the allocator's instrument
             (allocator.py: the higher peak) and MemoryLedger (memory.py), never timed

Times are perf_counter() seconds since t0, this rank's clock when every rank left one barrier.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from minidist import Topology, comm, strategies
from minidist.precision import loss_scaler
from minidist.compare import replay
from minidist.compare.allocator import AllocatorPeak
from minidist.compare.memory import MemoryLedger, roles_of
from minidist.compare.composed import context_parallel, pipeline, tensor_parallel
from minidist.mesh import CP, PP, TP, Layout, data_parallel_mesh
from minidist.strategies.single import SINGLE
from minidist.train.data import BatchStream
from minidist.parallel.parallelize import (build_layout, build_optimizer, local_batch, local_world, optimizer_class,
                                           parallelize, precision_policy)
from minidist.train.preemption import PreemptionWatch
from minidist.train.task import make_task
from minidist.train.run_state import Run
from minidist.train.trainer import train_step


class Phased:
    """The task, noting the edges of each step's phases (the trainer's step itself is unchanged)."""

    def __init__(self, task):
        self.task = task
        self.edges: list[list[float]] = []
        """Per step: [forward start, forward end, backward start, backward end]."""

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def loss(self, model, batch) -> torch.Tensor:
        start = time.perf_counter()
        loss = self.task.loss(model, batch)
        edges = [start, time.perf_counter(), None, None]
        self.edges.append(edges)
        if loss.requires_grad:
            loss.register_hook(lambda grad: self._backward_started(edges, grad))
        return loss

    @staticmethod
    def _backward_started(edges: list, grad):
        edges[2] = time.perf_counter()
        queue = torch.autograd.Variable._execution_engine.queue_callback

        def last():  # queued by a callback: runs after every callback queued in this backward (DDP's, FSDP's)
            edges[3] = time.perf_counter()
        queue(lambda: queue(last))
        return grad


class Bench:
    """A model set up on this rank as the trainer sets it up, and the trainer's Run around it."""

    def __init__(self, cfg, strategy_cfg, topo: Topology, train_ds, plain: bool = False):
        self.topo, self.strategy_cfg = topo, strategy_cfg
        pp = 1 if plain else strategy_cfg.get("pp_size", 1)
        self.microbatches = cfg.pp_microbatches if pp > 1 else 1  # a pipeline's trainer.microbatches
        self.cfg = OmegaConf.merge(cfg, {"trainer": {"log_interval": 2**31 - 1,  # the trainer traces nothing itself
                                                     "microbatches": self.microbatches}})
        self.layout = Layout(data_parallel_mesh(topo)) if plain else build_layout(strategy_cfg, topo)
        torch.manual_seed(cfg.trainer.seed)
        task = make_task(cfg.model)
        model, self.blocks = task.build()
        model = model.to(topo.device)
        if plain:
            cls, kwargs = optimizer_class(cfg.optim)
            self.model, self.optimizer = model, cls(model.parameters(), **kwargs)
        else:
            policy = precision_policy(cfg.trainer, strategy_cfg)
            self.model = parallelize(model, self.layout, strategy_cfg, self.blocks, policy, self.microbatches)
            self.optimizer = build_optimizer(self.model, self.layout, strategy_cfg, cfg.optim, policy)
        self.task = Phased(task)
        shared = self.tp_size * self.layout.size(CP) * self.layout.size(PP)  # ranks that share one batch
        self.batch = cfg.trainer.batch_size * shared  # the same global batch every row
        stream = BatchStream(train_ds, self.batch, self.layout.dp_rank, self.layout.dp_size, cfg.trainer.seed)
        fp16 = cfg.trainer.precision.value == "fp16" and not plain  # the plain step needs no loss scale to be timed
        scaler = loss_scaler("fp16" if fp16 else "fp32", topo.device.type)
        record = SINGLE if plain else strategies.get(strategy_cfg.name)  # plain: no wrapper, a torch optimizer
        self.run = Run(self.cfg, topo, self.layout, None, None, self.task, self.model, self.optimizer, record, stream,
                       None, None, None, {}, PreemptionWatch([], topo.device), scaler)
        if not plain:  # under context parallelism each rank computes on its tokens of the rows (the trainer's cut)
            self.run.local_batch = functools.partial(local_batch, layout=self.layout, strategy_cfg=strategy_cfg)
        self.steps = 0

    @property
    def tp_size(self) -> int:
        """Ranks per tensor-parallel group (1: none); they share each batch of T x trainer.batch_size."""
        return self.layout.size(TP) if TP in self.layout.mesh_dim_names else 1

    def step(self) -> tuple[float, float]:
        """One trainer step; (start, end) perf_counter()."""
        start = time.perf_counter()
        train_step(self.run, self.steps)
        self.steps += 1
        return start, time.perf_counter()

    def bucket_numels(self) -> list[int]:
        """The gradient buckets as the engine built them (sizes only: nothing is allocated), as the strategy's
        record reads them: DDP's reducer's, or ZeRO's (its flat partitions padded to N); none for FSDP."""
        if self.layout.size(PP) > 1:  # each stage's engine its own (minidist.parallel.pipeline)
            return [n for s in self.model.stages for n in self.run.strategy.buckets(s.runner, self.optimizer)]
        return self.run.strategy.buckets(self.model, self.optimizer)

    def timeline(self, t0: float) -> list[list] | None:
        """The pipeline's record of its last step (Pipeline.timeline: compute actions and waits for messages),
        [what, start, end] in seconds since t0; None without a pipeline."""
        if self.layout.size(PP) == 1:
            return None
        return [[what, a - t0, b - t0] for what, a, b in self.model.pipeline.timeline]


def _phases(task: Phased, steps: list[tuple[float, float]], t0: float) -> list[list]:
    """[phase, step, start, end] rows (seconds since t0) of the last len(steps) steps."""
    out = []
    for i, ((start, end), e) in enumerate(zip(steps, task.edges[-len(steps):])):
        bwd_start, bwd_end = e[2] or e[1], e[3] or e[2] or e[1]
        for name, a, b in (("forward", e[0], e[1]), ("backward", bwd_start, bwd_end), ("optimizer", bwd_end, end)):
            out.append([name, i, a - t0, b - t0])
    return out


PHASES = ("warm-up", "measured", "alone", "memory")
"""The phases of measure_strategy, in order (the module docstring; build is part of warm-up)."""


def measure_strategy(cfg, strategy_cfg, topo: Topology, train_ds, t0: float, row: str | None = None,
                     phase: Callable[[str], None] = lambda what: None) -> dict:
    """Warm up, measure (alternating with the plain model), replay, memory; this rank's raw results (plain JSON).
    row: the row's name in cfg.strategies (`full_shard+tp2`; default the strategy's name). phase(what) is called
    on every rank as each of PHASES starts, outside every measured window (the comparison's progress and its
    vote on a signal: a collective there is not in any measurement)."""
    name = row or strategy_cfg.name
    phase(PHASES[0])
    bench, plain = Bench(cfg, strategy_cfg, topo, train_ds), Bench(cfg, None, topo, train_ds, plain=True)
    for _ in range(cfg.warmup_steps):
        bench.step(), plain.step()
    gloo = topo.backend == "gloo"
    steps, baseline, timelines = [], [], []
    phase(PHASES[1])
    with (comm.kernel_io.written() if gloo else contextlib.nullcontext()) as written, comm.trace() as tr:
        for i in range(cfg.steps):  # alternating, each first in turn: load drifts hit both alike
            for b in ((bench, plain) if i % 2 == 0 else (plain, bench)):
                dist.barrier()  # torch's own: not traced; the kernel's count is corrected below
                (steps if b is bench else baseline).append(b.step())
            timelines.append(bench.timeline(t0))
    last = [r for r in tr.records if r.issued_s >= steps[-1][0]]
    phase(PHASES[2])
    alone = replay.replay(last, tr.groups, topo.device, cfg.replay_repeats)
    raw = {"strategy": name, "rank": topo.rank, "world": topo.world_size, "backend": topo.backend,
           "device": topo.device.type, "local_world": local_world(topo),
           "mesh": {"dims": list(bench.layout.mesh_dim_names), "shape": list(bench.layout.mesh.mesh.shape)},
           "records": _records(tr, t0, name), "waits": [[a - t0, b - t0] for a, b, _ in tr.waits],
           "main_waits": [[a - t0, b - t0] for a, b, t in tr.waits if t == _MAIN],
           "steps": [[a - t0, b - t0] for a, b in steps], "phases": _phases(bench.task, steps, t0),
           "baseline": {"steps": [[a - t0, b - t0] for a, b in baseline], "phases": _phases(plain.task, baseline, t0)},
           "kernel_bytes": written.bytes - cfg.steps * written.barrier_pair if gloo else None,
           "alone": alone, "bucket_numels": bench.bucket_numels(), "tp": tensor_parallel(cfg, bench),
           "cp": context_parallel(bench), "pp": pipeline(bench, timelines)}
    del bench, plain, tr
    if cfg.memory:
        phase(PHASES[3])
    raw["memory"] = measure_memory(cfg, strategy_cfg, topo, train_ds) if cfg.memory else None
    gc.collect()
    return raw


_MAIN = threading.main_thread().ident


def _records(tr: comm.Trace, t0: float, strategy: str) -> list[dict]:
    """The trace's records as plain dicts, times in seconds since t0."""
    out = []
    for r in tr.records:
        futureless = r.async_op and r.op == "reduce_scatter" and r.algorithm == "native" and r.wire_op == "all_reduce"
        out.append({"strategy": strategy, "op": r.op, "group": r.group, "group_size": r.group_size, "dtype": r.dtype,
                    "payload_bytes": r.payload_bytes, "sent_bytes": r.sent_bytes, "algorithm": r.algorithm,
                    "wire_op": r.wire_op or r.op, "wire_bytes": r.wire_bytes, "async_op": r.async_op,
                    "issued": r.issued_s - t0, "launched": (r.launched_s or r.issued_s) - t0,
                    "completed": None if r.completed_s is None else r.completed_s - t0, "waited": r.waited_s,
                    "completion": "wait" if futureless else "future" if r.async_op else "sync"})
    return out


def measure_memory(cfg, strategy_cfg, topo: Topology, train_ds) -> dict:
    """Peak of one step: the allocator's (counted from before the model is built) and the ledger's, by role."""
    gc.collect()  # nothing allocated before the profiler may die inside it (allocator.py)
    with AllocatorPeak(topo.device) as peak:
        bench = Bench(cfg, strategy_cfg, topo, train_ds)
        for _ in range(2):
            bench.step()
        for _ in range(2):  # two steps can peak differently (allocator.py): the higher counts
            ledger = MemoryLedger(roles_of(bench.model, bench.optimizer))
            with peak.window(), ledger:
                start, end = bench.step()
        snap, edges = ledger.peak, bench.task.edges[-1] if bench.task.edges else None
        del bench, ledger
        gc.collect()
    phase = ("-" if edges is None  # a pipeline's phases interleave (its micro-batches' forwards and backwards)
             else "forward" if snap.time < edges[1] else "backward" if snap.time < (edges[3] or end) else "optimizer")
    return {"allocator": peak.bytes, "allocator_peaks": peak.peaks, "allocator_at_start": peak.at_start,
            "instrument": peak.instrument, "ledger": snap.total, "by_role": snap.by_role, "where": phase}
