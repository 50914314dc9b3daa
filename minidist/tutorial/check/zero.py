"""The checks of the two sharded optimizers: ZeRO-1 as the paper does it, and the owner-broadcast variant.

Both take CS336's shape, ShardedOptimizer(params, optimizer_cls, **kwargs), and must step as
optimizer_cls(params, **kwargs) would on one process: two parameter groups (one added after
construction, as CS336's test does), weight decay, and an lr scheduler that edits the groups.
The paper's optimizer reduces the gradients itself (a reduce_scatter), so its model is not wrapped;
the variant's gradients are averaged first, by the checker's own all_reduce (any DDP would do).

Memory is what the optimizer's construction and first step leave allocated (torch's MemTracker): the
state it keeps. AdamW keeps 8 bytes per parameter it steps; sharded, 8 psi / N (the paper; plus a
4 psi / N fp32 copy of the partition) or 8 (psi / N + the largest parameter) (the variant: whole
parameters balance only so well).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist.tutorial.check.instruments import Memory, Profiled, kernel_bytes, over_ranks
from minidist.tutorial.check.models import mlp, my_slice, psi, seeded
from minidist.tutorial.check.verdict import Check, Verdict, kib, within

K = 4
DIMS = (13, 64, 64, 37, 5)


def make_optimizer(mod: ModuleType, model: nn.Module, cls=None):
    """Two groups: the first layer at construction, the rest added after, each with its own lr."""
    first, *rest = model.layers
    groups = [{"params": list(first.parameters()), "lr": 0.01}]
    later = {"params": [p for layer in rest for p in layer.parameters()], "lr": 0.03}
    opt = (cls or (lambda g, **kw: mod.ShardedOptimizer(g, torch.optim.AdamW, **kw)))(groups, lr=0.02,
                                                                                     weight_decay=0.1)
    opt.add_param_group(later)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def backward(model: nn.Module, step: int, whole: bool, average: bool) -> None:
    n = 8 * dist.get_world_size()
    x, y = torch.randn(n, 13, generator=seeded(30 + step)), torch.randn(n, 5, generator=seeded(40 + step))
    if not whole:
        x, y = my_slice(x), my_slice(y)
    nn.functional.mse_loss(model(x), y).backward()
    if average:  # the variant's DDP: the mean gradient on every rank
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def equals_adamw(variant: bool, mod: ModuleType) -> Verdict:
    reference, model = mlp(0, dims=DIMS), mlp(0, dims=DIMS)
    (ref_opt, ref_sched), (opt, sched) = make_optimizer(mod, reference, torch.optim.AdamW), make_optimizer(mod, model)
    for k in range(K):
        backward(reference, k, whole=True, average=False)
        backward(model, k, whole=False, average=variant)
        for o, s in ((ref_opt, ref_sched), (opt, sched)):
            o.step()
            o.zero_grad()
            s.step()
    err = over_ranks(max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters())))
    return Verdict(err < 1e-5, f"after {K} steps (two groups, one added later, StepLR): largest difference from "
                   f"torch.optim.AdamW on one process {err:.1e} (want < 1e-5)")


def traffic(variant: bool, mod: ModuleType) -> Verdict:
    model = mlp(0, dims=DIMS)
    opt, _ = make_optimizer(mod, model)
    n, s = dist.get_world_size(), 4 * psi(model)
    backward(model, 0, whole=False, average=variant)
    opt.step()
    opt.zero_grad()
    backward(model, 1, whole=False, average=variant)

    def step():
        with Profiled() as p:
            with p.window("step"):
                opt.step()
        return p

    box = []
    mean, _ = kernel_bytes(lambda: box.append(step()))
    reduces = int(over_ranks(box[0].count("c10d::allreduce", "step")))
    if variant:
        want = s * (n - 1) / n
        return Verdict(within(mean, want, 0.97, 1.15), f"the step writes {kib(mean)} per rank (mean; the kernel's "
                       f"count), {mean / want:.3f}x S (N-1)/N (want 0.97-1.15x: each parameter sent once by its owner)")
    want = 2 * s * (n - 1) / n
    return Verdict(reduces == 0 and within(mean, want, 0.99, 1.15),
                   f"the step writes {kib(mean)} per rank (the kernel's count), {mean / want:.3f}x DDP's 2 S (N-1)/N "
                   f"(want 0.99-1.15x: padding and gloo's headers), with {reduces} all_reduces (want 0)")


def state_memory(variant: bool, mod: ModuleType) -> Verdict:
    model = mlp(0, dims=DIMS)
    n, total = dist.get_world_size(), psi(model)
    backward(model, 0, whole=False, average=variant)
    with Memory(model) as mem:
        opt, _ = make_optimizer(mod, model)
        opt.step()
    mine = mem.kept
    largest, summed = over_ranks(mine), over_ranks(mine, dist.ReduceOp.SUM)
    if variant:
        bound = 8 * (total / n + max(q.numel() for q in model.parameters()))
        ok = largest <= bound + 1024 and within(summed, 8 * total, 0.99, 1.05)
        return Verdict(ok, f"construction + first step leave {kib(largest)} on the largest rank (torch's MemTracker; "
                       f"want at most 8 (psi/N + largest parameter) = {kib(bound)}) and {kib(summed)} over all ranks "
                       f"(want AdamW's 8 psi = {kib(8 * total)}: each parameter's state on one rank)")
    padded = sum(-(-sum(q.numel() for q in g["params"]) // n) for g in opt.param_groups)  # elements per partition
    bound = 12 * padded
    return Verdict(8 * total / n * 0.98 <= largest <= bound + 1024,
                   f"construction + first step leave {kib(largest)} on the largest rank (torch's MemTracker; want "
                   f"8 psi/N = {kib(8 * total / n)} of AdamW state, at most 12 psi/N = {kib(bound)} with the "
                   f"partition's copy; torch.optim.AdamW keeps {kib(8 * total)})")


def checks(variant: bool) -> tuple[Check, ...]:
    return (Check("equal to torch.optim.AdamW", functools.partial(equals_adamw, variant)),
            Check("bytes per step", functools.partial(traffic, variant)),
            Check("optimizer state per rank", functools.partial(state_memory, variant)))


CHECKS = {"zero1": checks(False), "sharded_optimizer": checks(True)}
