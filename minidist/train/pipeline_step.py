"""The training step and the evaluation of a pipelined run (strategy.pp_size > 1): minidist.train.trainer's
phases, through the pipeline (minidist.parallel.pipeline builds it).

    loss = step_loss(run, batch)       # Pipeline.step: trainer.microbatches pieces, the schedule's order
    sums = eval_sums(run, batch)       # forward only, stage after stage

The loss is computed on the last stage's rank only; it is broadcast over "pp" so that every rank
logs it, and sums over the data-parallel ranks as any run's do (minidist.train.trainer.log_step).
Clipping sums the squared norms of every stage (minidist.pp.clip_grad_norm_), the optimizer
steps the rank's stages. One step's gradient reduction per stage: each engine reduces in the
stage's last backward (minidist.pp.compose.gradient_sync).
"""

from __future__ import annotations

import contextlib
import time

import torch

from minidist import comm, pp
from minidist.mesh import PP, Layout
from minidist.strategies import contract


def from_last_stage(value: torch.Tensor | None, like: torch.Tensor, layout: Layout) -> torch.Tensor:
    """`value` (present on the last stage's rank) on every rank of the pipeline: one broadcast over "pp"."""
    out = value.detach().to(like.dtype) if value is not None else torch.zeros_like(like)
    comm.broadcast(out, group=layout[PP].get_group(), group_src=layout.size(PP) - 1)
    return out


def train_step(run, lr: float, traced: bool) -> tuple:
    """One optimizer step through the pipeline at learning rate `lr` (set already): the trainer's StepStats
    after its step count (loss, grad_norm, lr, seconds, items, trace)."""
    tc, opt, pipe, layout = run.cfg.trainer, run.optimizer, run.model.pipeline, run.layout
    t0 = time.perf_counter()
    run.preemption.start_step()
    with comm.trace() if traced else contextlib.nullcontext() as tr:
        batch = [b.to(run.topo.device, non_blocking=True) for b in next(run.stream)]
        items = run.task.count(batch) * layout.dp_size  # the rows read, before cp cuts out my tokens
        x, y = run.local_batch(batch)
        with run.autocast():
            loss = pipe.step(x, target=y)
        loss = from_last_stage(loss, torch.zeros((), device=run.topo.device), layout)
        zero = opt if run.strategy.optimizer_engine is contract.ShardedOptimizerState else None
        grad_norm = pp.clip_grad_norm_(pipe, tc.grad_clip, layout, optimizer=zero) if tc.grad_clip > 0 else None
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss, grad_norm, lr, time.perf_counter() - t0, items, tr


def eval_sums(run, batch) -> torch.Tensor:
    """[summed loss in nats, tokens], as LanguageModeling.eval_sums, the loss from the last stage."""
    x, y = run.local_batch([b.to(run.topo.device) for b in batch])
    with run.autocast():
        loss = pp.forward_loss(run.model.pipeline, x, y)
    loss = from_last_stage(loss, torch.zeros((), dtype=torch.float64, device=run.topo.device), run.layout)
    return torch.stack([loss * y.numel(), loss.new_tensor(y.numel())])

