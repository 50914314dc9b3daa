"""The training loop, in phases, the same for every strategy and model.

    plan = plan_run(cfg, topo, layout)     # where the run lives; nothing to do if it already finished
    run = setup(cfg, topo, layout, plan)   # seed, model + wrappers, data, resume, logger
    for step in range(run.start_step, cfg.trainer.steps):
        stats = train_step(run, step)      # grad_accum micro-batches, clip, optimizer step
        log_step(run, stats)               # on log steps only: the one host sync, a metrics row
        evaluate / save_checkpoint         # at their intervals
    return finish(run)                     # final evaluation, <run>/model.pt, sample, plot (train/finish.py)

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
from pathlib import Path
from typing import Callable, Sequence

import torch
from omegaconf import OmegaConf

from minidist import Topology, comm, strategies
from minidist.precision import loss_scaler
from minidist.mesh import PP, Layout
from minidist.train import pipeline_step
from minidist.train.checkpoint import Checkpointer
from minidist.train.checkpoint_files import layout_label
from minidist.train.data import BatchStream, build_datasets
from minidist.train.finish import PREEMPTED, evaluate, finish, stopped
from minidist.train.run_state import Run, StepStats
from minidist.train.metrics import NullLogger, RunLogger, comm_summary
from minidist.parallel.parallelize import (build_layout, build_optimizer, clip_grad_norm_, local_batch, no_sync,
                                           parallelize, precision_policy)
from minidist.train.preemption import PreemptionWatch
from minidist.train.run_dir import Action, RunPlan, RunRequest, plan_run, write_config
from minidist.train.task import make_task

STOPPING_LINE = "SIGINT: stopping after this step with a checkpoint (Ctrl-C again stops at once, without one)"
"""What the main process says the moment Ctrl-C arrives (the run stops at the next step boundary)."""


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


# ------------------------------------------------------------------------ checkpoint
def save_checkpoint(run: Run, step: int) -> None:
    extra = {"scaler": run.scaler.state_dict()} if run.scaler is not None else {}
    run.ckpt.save(step, {"step": step, "data": run.stream.state_dict()} | extra)


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
                return stopped(run, done)
        return finish(run)
    finally:
        run.preemption.close()
        run.logger.close()
