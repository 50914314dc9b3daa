"""The training loop, in phases, the same for every strategy and model.

    plan = plan_run(cfg, topo, layout)     # where the run lives; nothing to do if it already finished
    run = setup(cfg, topo, layout, plan)   # seed, model + wrappers, data, resume, logger
    for step in range(run.start_step, cfg.trainer.steps):
        stats = train_step(run, step)      # grad_accum micro-batches, clip, optimizer step
        log_step(run, stats)               # on log steps only: the one host sync, a metrics row
        evaluate / save_checkpoint         # at their intervals
    return finish(run)                     # final evaluation, <run>/model.pt, sample, plot

`train(cfg, topo)` runs exactly that. One optimizer step = grad_accum micro-batches
per rank; only the last one communicates (the others run under no_sync), so a
step costs one gradient reduction however many micro-batches it has. Every
log_interval-th step runs inside minidist.comm.trace(), so the metrics show what
that step sent. Callbacks (`callbacks=[fn]`, fn(run, step_done)) run after every
step; one may call `run.request_stop()`, and the run then checkpoints and returns.
train() does not create or destroy the process group: the recipe (or a test) owns it.
With strategy.pp_size > 1 the model is this rank's pipeline stages and the step and the
evaluation go through the pipeline (minidist.train.pipeline_step): trainer.microbatches
pieces in the schedule's order, the loss broadcast from the last stage.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from omegaconf import OmegaConf

from minidist import Topology, comm, strategies
from minidist.precision import loss_scaler
from minidist.mesh import PP, Layout
from minidist.models.saved import save_model
from minidist.train import pipeline_step
from minidist.train.checkpoint import Checkpointer
from minidist.train.checkpoint_files import layout_label
from minidist.train.data import BatchStream, build_datasets
from minidist.train.metrics import NullLogger, RunLogger, comm_summary, plot
from minidist.parallel.parallelize import (build_layout, build_optimizer, clip_grad_norm_, full_state_dict,
                                           local_batch, no_sync, parallelize, precision_policy)
from minidist.train.preemption import PreemptionWatch
from minidist.train.run_dir import Action, RunPlan, RunRequest, plan_run, write_config
from minidist.train.task import make_task

PREEMPTED = "PREEMPTED"
"""Marker in the run directory: the last stop was a preemption (launch/slurm.sbatch requeues on it)."""

STOPPING_LINE = "SIGINT: stopping after this step with a checkpoint (Ctrl-C again stops at once, without one)"
"""What the main process says the moment Ctrl-C arrives (the run stops at the next step boundary)."""


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


Callback = Callable[[Run, int], None]


def lr_at(step: int, optim_cfg, total_steps: int) -> float:
    """Linear warmup over warmup_steps, then cosine from lr down to lr * min_lr_ratio at the last step."""
    peak, warm = optim_cfg.lr, optim_cfg.warmup_steps
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total_steps - warm)
    floor = peak * optim_cfg.min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ----------------------------------------------------------------------------- setup
def setup(cfg, topo: Topology, layout: Layout, plan: RunPlan, request: RunRequest | None = None) -> Run:
    """Build the run on every rank: model and wrappers, optimizer, data, checkpoints; resume.
    Nothing is written before all of it succeeded."""
    tc = cfg.trainer
    run_dir = plan.dir
    torch.manual_seed(tc.seed)
    random.seed(tc.seed)
    task = make_task(cfg.model)
    model, blocks = task.build()  # identical init on every rank (same seed)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}  # the whole model's, for checkpoints
    policy = precision_policy(tc, cfg.strategy)  # trainer.precision: the engines' dtypes
    model = parallelize(model.to(topo.device), layout, cfg.strategy, blocks, policy, tc.microbatches)
    optimizer = build_optimizer(model, layout, cfg.strategy, cfg.optim, policy)
    scaler = loss_scaler(tc.precision.value, topo.device.type)
    train_ds, val_ds, info = build_datasets(cfg, topo)
    rank, world = layout.dp_rank, layout.dp_size  # ranks that differ only in tp read the same data
    stream = BatchStream(train_ds, tc.batch_size, rank, world, tc.seed)
    val_stream = BatchStream(val_ds, tc.batch_size, rank, world, tc.seed, shuffle=False)
    ckpt = Checkpointer(run_dir, tc.keep_last, model, optimizer, layout, shapes=shapes, strategy=cfg.strategy.name)
    start, resumed_from, note, was = _resume(cfg, ckpt, stream, scaler)  # validates it before any file is written
    logger = NullLogger()
    if layout.is_main:
        write_config(plan, cfg, request)
        logger = RunLogger(run_dir, cfg, start, tc.steps, OmegaConf.to_container(cfg, enum_to_str=True),
                           plan.label)
        (run_dir / PREEMPTED).unlink(missing_ok=True)
    if plan.message:
        logger.message(plan.message)
    if resumed_from is not None:
        now = layout_label(cfg.strategy.name, layout.names, tuple(layout.mesh.shape))
        changed = f"; written by {was}, continuing as {now}" if was != now else ""
        logger.message(f"resumed from step {start} ({resumed_from}){changed}" + (f"; {note}" if note else ""))
        if changed:  # the curves mark where the layout changed (metrics.plot)
            logger.event({"step": start, "layout": now, "was": was})
    comm.flight_recorder.install_dump_handlers(str(run_dir))  # a hang or an error: flight_rank{r}.json here
    watch = PreemptionWatch(list(tc.preempt_signals), topo.device,
                            announce=STOPPING_LINE if layout.is_main else None)
    return Run(cfg, topo, layout, plan, run_dir, task, model, optimizer, strategies.get(cfg.strategy.name), stream,
               val_stream, ckpt, logger, info, watch, scaler, start, request=request,
               local_batch=functools.partial(local_batch, layout=layout, strategy_cfg=cfg.strategy))


def _resume(cfg, ckpt: Checkpointer, stream: BatchStream, scaler=None) -> tuple[int, Path | None, str, str]:
    """(first step to run, the checkpoint it comes from, what was not carried over, what wrote it): restores
    model, optimizer, RNG, data position and the fp16 loss scale."""
    if cfg.resume == "never":
        return 0, None, "", ""
    d = ckpt.usable(None if cfg.resume == "auto" else Path(cfg.resume))
    if d is None:
        return 0, None, "", ""
    state = ckpt.load(d)
    stream.load_state_dict(state["data"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    return int(state["step"]), d, state["note"], state["written_by"]


# ------------------------------------------------------------------------------ step
def train_step(run: Run, step: int) -> StepStats:
    """One optimizer step: grad_accum micro-batches (communicating on the last), clip, update."""
    tc, opt = run.cfg.trainer, run.optimizer
    lr = lr_at(step, run.cfg.optim, tc.steps)
    for group in opt.param_groups:
        group["lr"] = lr
    traced = (step + 1) % tc.log_interval == 0
    if run.layout.size(PP) > 1:  # the pipeline runs its own micro-batches and backwards
        return StepStats(step + 1, *pipeline_step.train_step(run, lr, traced))
    t0 = time.perf_counter()
    items = 0
    run.preemption.start_step()  # outside the trace: the vote is not the step's communication
    with comm.trace() if traced else contextlib.nullcontext() as tr:
        step_loss = torch.zeros((), device=run.topo.device)  # summed on the device: no host sync
        for micro in range(tc.grad_accum):
            batch = [b.to(run.topo.device, non_blocking=True) for b in next(run.stream)]
            items += run.task.count(batch)  # the rows this data shard read, before cp cuts out my tokens
            batch = run.local_batch(batch)
            last = micro == tc.grad_accum - 1
            skip = contextlib.nullcontext() if last else no_sync(run.model, opt, run.strategy)
            with skip:  # backward inside too: ZeRO and FSDP read it there
                with run.autocast():
                    loss = run.task.loss(run.model, batch) / tc.grad_accum
                (loss if run.scaler is None else run.scaler.scale(loss)).backward()
            step_loss += loss.detach()
        if run.scaler is not None and tc.grad_clip > 0:
            run.scaler.unscale_(opt)  # clip the true gradients
        grad_norm = clip_grad_norm_(run.model, tc.grad_clip, run.layout, opt,
                                    strategy=run.strategy) if tc.grad_clip > 0 else None
        if run.scaler is None:
            opt.step()
        else:
            run.scaler.step(opt)  # skipped on every rank if any rank found an inf
            run.scaler.update()
        opt.zero_grad(set_to_none=True)
    return StepStats(step + 1, step_loss, grad_norm, lr, time.perf_counter() - t0,
                     items * run.layout.dp_size, tr)


# ------------------------------------------------------------------------------- log
def log_step(run: Run, stats: StepStats) -> None:
    """Collect the step; on a traced step or the last one, write a metrics row (the only host sync)."""
    run.window.append(stats)
    if stats.trace is None and stats.step != run.cfg.trainer.steps:
        return
    window, run.window = run.window, []
    # summed over the data-parallel ranks only: ranks that differ in tp hold the same loss, and so do cp
    # ranks (the model's loss is the mean over every cp rank's tokens: minidist.cp.plan)
    mean_loss = run.layout.all_reduce(torch.stack([s.loss for s in window]).mean().double())
    mean_loss = float(mean_loss) / run.layout.dp_size
    step_s = sum(s.seconds for s in window) / len(window)
    per_s = stats.items / step_s
    row = {"step": stats.step, "train/loss": mean_loss, "train/lr": stats.lr, "train/step_s": step_s,
           f"train/{run.task.unit}_per_s": per_s}
    if stats.grad_norm is not None:
        row["train/grad_norm"] = float(stats.grad_norm)
    if stats.trace is not None:
        row |= comm_summary(stats.trace)
    run.logger.log(row)
    run.logger.progress(stats.step, {"loss": f"{mean_loss:.3f}", f"{run.task.unit[:3]}/s": f"{per_s:,.0f}",
                                     "step": f"{step_s * 1e3:.0f}ms"})


# -------------------------------------------------------------------------- evaluate
@torch.no_grad()
def evaluate(run: Run, max_batches: int | None) -> dict[str, float]:
    """Every rank runs the same number of validation batches of its own shard; the sums are all-reduced over
    the data-parallel ranks (cp ranks' losses are their shard's mean over all its tokens already)."""
    run.model.eval()
    sums = None
    for batch in run.val_stream.one_pass(max_batches):
        with run.autocast():
            s = pipeline_step.eval_sums(run, batch) if run.layout.size(PP) > 1 else \
                run.task.eval_sums(run.model, run.local_batch([b.to(run.topo.device) for b in batch]))
        sums = s if sums is None else sums + s
    run.model.train()
    return run.task.report(run.layout.all_reduce(sums).cpu())


def save_checkpoint(run: Run, step: int) -> None:
    extra = {"scaler": run.scaler.state_dict()} if run.scaler is not None else {}
    run.ckpt.save(step, {"step": step, "data": run.stream.state_dict()} | extra)


# ---------------------------------------------------------------------------- finish
def finish(run: Run) -> dict:
    """Final evaluation on the whole validation split, the model file, a text sample and the plot."""
    tc = run.cfg.trainer
    final = evaluate(run, None)
    full_state = full_state_dict(run.model, run.layout, run.strategy)
    result = {"run_dir": str(run.run_dir), "stopped": False, **run.info, **final, "step": tc.steps,
              "wall_s": time.perf_counter() - run.t0}
    if not run.layout.is_main:
        return result
    lines = ["final  " + "  ".join(f"{k} {v:.4f}" for k, v in final.items())]
    if "unigram_bpb" in run.info:
        ratio = final["val/bits_per_byte"] / run.info["unigram_bpb"]
        result["bpb_vs_unigram"] = ratio
        lines.append(f"bits per byte: {final['val/bits_per_byte']:.2f}, unigram baseline "
                     f"{run.info['unigram_bpb']:.2f}, ratio {ratio:.2f} (lower is better)")
    if tc.sample_bytes and run.task.unit == "tokens":
        lines.append("sample:\n" + _sample(run.task, full_state, tc.sample_bytes))
    model_file = save_model(run.run_dir, run.cfg.model, full_state, tc.steps)
    run.logger.log({"step": tc.steps, **{f"final/{k.split('/')[-1]}": v for k, v in final.items()}})
    png = plot(run.run_dir, run.task.unit)
    where = run.run_dir.resolve()
    lines.append(f"outputs in {where} ({model_file.name}, metrics.jsonl, {png.name}, .hydra/config.yaml); "
                 f"the model: minidist.models.load({str(where)!r})")
    for line in lines:
        run.logger.message(line)
    return result | {"model_state": full_state}


def _sample(task, full_state: dict, n_bytes: int) -> str:
    """A fresh copy of the model on the CPU, loaded with the full state, continues a prompt."""
    model, _ = task.build()
    model.load_state_dict(full_state)
    model.eval()
    prompt = torch.tensor([list(b"def ")], dtype=torch.long)
    out = model.generate(prompt, n_bytes, temperature=0.8, top_k=40, generator=torch.Generator().manual_seed(0))
    return bytes(out[0].tolist()).decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------ loop
def train(cfg, topo: Topology, callbacks: Sequence[Callback] = (), request: RunRequest | None = None) -> dict:
    """Run (or resume) the training described by cfg on every rank of topo; return the final metrics.
    request: the directory the launcher chose (see run_dir.RunRequest); None = <out_dir>/<name>."""
    if cfg.debug_collectives:
        comm.set_debug(True)
    layout = build_layout(cfg.strategy, topo)
    plan = plan_run(cfg, topo, layout, request)
    if plan.action is Action.FINISHED:
        if layout.is_main:
            print(plan.message, flush=True)
        return {"run_dir": str(plan.dir), "stopped": False, "finished_already": True, "step": plan.step}
    run = setup(cfg, topo, layout, plan, request)
    tc = cfg.trainer
    try:  # the logger's files are closed however the loop ends (a crash included)
        for step in range(run.start_step, tc.steps):
            stats = train_step(run, step)
            log_step(run, stats)
            done = stats.step
            if tc.eval_interval and done % tc.eval_interval == 0 and done != tc.steps:
                metrics = evaluate(run, tc.eval_batches)
                run.logger.log({"step": done, **metrics})
                run.logger.message(f"step {done}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            for callback in callbacks:
                callback(run, done)
            if run.preemption.should_stop():
                run.request_stop()
                run.preempted = True
            stopping = run.stop_requested and done != tc.steps
            if (tc.ckpt_interval and done % tc.ckpt_interval == 0) or stopping:
                save_checkpoint(run, done)
            if stopping:
                return _stopped(run, done)
        return finish(run)
    finally:
        run.preemption.close()
        run.logger.close()


def _stopped(run: Run, done: int) -> dict:
    caught = run.preemption.caught
    why = "stopped" if not run.preempted else f"interrupted ({caught})" if caught == "SIGINT" else \
        f"preempted ({caught or 'a signal on another rank'})"
    if run.layout.is_main and run.preempted:
        (run.run_dir / PREEMPTED).write_text(f"{done}\n")
    command = run.request.command if run.request is not None else None
    run.logger.message(f"{why} after step {done}, checkpoint saved in {run.ckpt.step_dir(done)}; "
                       + (f"continue with:\n  {command}" if command else "resume=auto continues"))
    return {"run_dir": str(run.run_dir), "stopped": True, "preempted": run.preempted, "step": done}
