"""The checks of the pipeline rung: one stage per rank, micro-batches, GPipe and 1F1B over send and recv.

The model is N blocks (Linear(h, 4h), GELU, Linear(4h, h)), rank r holding block r; every rank is
given the same batch. The learner's Pipeline must train like one process running all N blocks
on the whole batch, under both schedules; send each micro-batch's activation forward and its
gradient back, once per boundary (2 b h e bytes per boundary and step, the kernel's count); and
hold the activations its schedule promises: GPipe all m micro-batches' on the first stage,
1F1B at most N - r on rank r (torch's dispatcher and weak
references to the storages, as MemTracker counts; in units of one micro-batch's forward).
"""

from __future__ import annotations

import copy
from types import ModuleType

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist.tutorial.check.instruments import Profiled, Storages, kernel_bytes, over_ranks
from minidist.tutorial.check.models import seeded
from minidist.tutorial.check.verdict import Check, Verdict, kib, within

SCHEDULES = ("gpipe", "1f1b")
K = 3
H = 32
ROWS = 16
"""Rows per micro-batch: one micro-batch's activations (9 ROWS h floats) are comparable to a block's weights."""
BYTES_H = 256
"""Width for the byte count: 16 KiB messages, where gloo's headers (about 0.5 KB per call) stay small."""


def microbatches() -> int:
    """4 N: enough that GPipe's m activations and 1F1B's N differ by far more than the transients."""
    return 4 * dist.get_world_size()


def blocks(h: int = H, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h)) for _ in range(dist.get_world_size())]


def batch(step: int, h: int = H) -> tuple[torch.Tensor, torch.Tensor]:
    n = ROWS * microbatches()
    return torch.randn(n, h, generator=seeded(80 + step)), torch.randn(n, h, generator=seeded(90 + step))


def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(y, target)


def pipeline(mod: ModuleType, schedule: str, h: int = H) -> tuple[nn.Module, object]:
    stage = copy.deepcopy(blocks(h)[dist.get_rank()])
    return stage, mod.Pipeline(stage, microbatches(), schedule)


def equals_one_process(mod: ModuleType) -> Verdict:
    errs, last = {}, dist.get_rank() == dist.get_world_size() - 1
    for schedule in SCHEDULES:
        reference = nn.Sequential(*blocks())
        stage, pipe = pipeline(mod, schedule)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, stage)]
        err = 0.0
        for k in range(K):
            x, y = batch(k)
            want = loss_fn(reference(x), y)
            want.backward()
            got = pipe.step(x, y, loss_fn)
            if last:
                err = max(err, float("inf") if got is None else abs(float(got) - want.item()))
            elif got is not None:
                err = float("inf")                      # only the last stage has the loss
            for opt in opts:
                opt.step()
                opt.zero_grad()
        mine = reference[dist.get_rank()]
        err = max([err] + [(a - b).abs().max().item() for a, b in zip(stage.parameters(), mine.parameters())])
        errs[schedule] = over_ranks(err)
    return Verdict(max(errs.values()) < 1e-5, f"after {K} SGD steps of {microbatches()} micro-batches: largest "
                   f"difference from one process on the whole batch (this rank's block, and the loss on the last) "
                   + ", ".join(f"{s} {e:.1e}" for s, e in errs.items()) + " (want < 1e-5)")


def messages(mod: ModuleType) -> Verdict:
    r, n, m = dist.get_rank(), dist.get_world_size(), microbatches()
    want = m * ((r < n - 1) + (r > 0))                  # an activation to r+1, a gradient to r-1, per micro-batch
    worst = {}
    for schedule in SCHEDULES:
        _, pipe = pipeline(mod, schedule)
        x, y = batch(0)
        pipe.step(x, y, loss_fn)
        with Profiled() as p:
            with p.window("step"):
                pipe.step(x, y, loss_fn)
        sends, recvs, collectives = (p.count(op, "step") for op in ("c10d::send", "c10d::recv_", "c10d::all"))
        worst[schedule] = over_ranks(abs(sends - want) + abs(recvs - want) + collectives)
    return Verdict(max(worst.values()) == 0, f"sends and receives per rank and step (torch's profiler): want m = {m} "
                   f"to each neighbour and from each, no collective; off by " +
                   ", ".join(f"{s} {int(w)}" for s, w in worst.items()) + " (want 0)")


def bytes_per_step(mod: ModuleType) -> Verdict:
    n = dist.get_world_size()
    _, pipe = pipeline(mod, "1f1b", BYTES_H)
    x, y = batch(0, BYTES_H)
    pipe.step(x, y, loss_fn)
    mean, _ = kernel_bytes(lambda: pipe.step(x, y, loss_fn))
    want = 2 * x.numel() * 4 * (n - 1) / n
    return Verdict(within(mean, want, 0.99, 1.05), f"{kib(mean)} written per rank (the kernel's count, mean), "
                   f"{mean / want:.3f}x 2 b h e (N-1)/N = {kib(want)}: each boundary carries the batch's activations "
                   f"forward and their gradients back once (want 0.99-1.05x: gloo's headers)")


def held_activations(mod: ModuleType) -> Verdict:
    r, n, m = dist.get_rank(), dist.get_world_size(), microbatches()
    stage = blocks()[r]
    x, y = batch(0)
    inp = x[:ROWS].clone().requires_grad_(r > 0)
    with Storages() as one:
        out = stage(inp)                                # one micro-batch's forward, kept for backward
    unit = one.kept
    del out
    peaks = {}
    for schedule in SCHEDULES:
        stage, pipe = pipeline(mod, schedule)
        pipe.step(x, y, loss_fn)                        # the gradients exist: a step adds to them in place
        with Storages() as mem:
            pipe.step(x, y, loss_fn)
        peaks[schedule] = mem.peak / unit
    gpipe_first = over_ranks(peaks["gpipe"] if r == 0 else float("inf"), dist.ReduceOp.MIN)
    excess = over_ranks(peaks["1f1b"] - (n - r))       # 1F1B: rank r holds at most N - r
    ok = gpipe_first >= 0.9 * m and excess <= 2.5
    return Verdict(ok, f"peak live bytes of a step, in micro-batch forwards ({kib(unit)} each; torch's dispatcher, as "
                   f"MemTracker counts): "
                   f"GPipe's first stage {gpipe_first:.1f} (want >= 0.9 m = {0.9 * m:.1f}); 1F1B at most "
                   f"{excess:+.1f} beyond N - r on every rank (want <= +2.5: a backward's"
                   f" transients, the loss's)")


CHECKS = {"pp": (Check("equal to one process", equals_one_process),
                 Check("messages per step", messages),
                 Check("bytes per step", bytes_per_step),
                 Check("activations held", held_activations))}
