"""The checks of the tensor-parallel rung: Megatron-LM's column- then row-parallel MLP.

Every rank holds the same fc = Linear(h, 4h) and proj = Linear(4h, h) and the same input; the
learner's ParallelMLP(fc, proj) must give one process's output and gradients, keep 1/N of the
weights, move only activations (one all_reduce of b s h forward, one backward: 2 x 2 b s h e
(N-1)/N bytes per rank, the kernel's count) and keep 1/N of the hidden activations for backward.
"""

from __future__ import annotations

import copy
from types import ModuleType

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from minidist.tutorial.check.instruments import Memory, Profiled, kernel_bytes, largest_difference, over_ranks
from minidist.tutorial.check.models import seeded
from minidist.tutorial.check.verdict import Check, Verdict, kib, within

B, S, H = 8, 64, 32


def layers(seed: int = 0) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(seed)
    return nn.Linear(H, 4 * H), nn.Linear(4 * H, H)


def plain(fc: nn.Linear, proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return proj(F.gelu(fc(x)))


def data(seed: int = 70) -> tuple[torch.Tensor, torch.Tensor]:
    """The same input on every rank, and a weighting of the output (a loss whose gradient is not uniform)."""
    return torch.randn(B, S, H, generator=seeded(seed)), torch.randn(B, S, H, generator=seeded(seed + 1))


def equals_one_process(mod: ModuleType) -> Verdict:
    fc, proj = layers()
    mlp = mod.ParallelMLP(copy.deepcopy(fc), copy.deepcopy(proj))
    x, w = data()
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ys = [plain(fc, proj, xs[0]), mlp(xs[1])]
    for y in ys:
        (y * w).sum().backward()
    n, r = dist.get_world_size(), dist.get_rank()
    pairs = {"output": (ys[1], ys[0]), "input's gradient": (xs[1].grad, xs[0].grad),
             "fc.weight's gradient (rows r)": (mlp.fc.weight.grad, fc.weight.grad.chunk(n, 0)[r]),
             "fc.bias's gradient": (mlp.fc.bias.grad, fc.bias.grad.chunk(n, 0)[r]),
             "proj.weight's gradient (columns r)": (mlp.proj.weight.grad, proj.weight.grad.chunk(n, 1)[r]),
             "proj.bias's gradient": (mlp.proj.bias.grad, proj.bias.grad)}
    worst, err = largest_difference(pairs)
    return Verdict(err < 1e-5, f"largest difference from one process: {err:.1e} ({worst}; want < 1e-5 for the output, "
                   f"the input's gradient and each slice's gradient)")


def sharded(mod: ModuleType) -> Verdict:
    fc, proj = layers()
    mlp = mod.ParallelMLP(copy.deepcopy(fc), copy.deepcopy(proj))
    n = dist.get_world_size()
    want = (fc.weight.numel() + fc.bias.numel() + proj.weight.numel()) // n + proj.bias.numel()
    mine = over_ranks(sum(p.numel() for p in mlp.parameters()))
    return Verdict(mine == want, f"parameters per rank: {int(mine)} elements (want {want}: 1/N of both weights and "
                   f"of fc's bias, proj's bias whole)")


def communication(mod: ModuleType) -> Verdict:
    fc, proj = layers()
    mlp = mod.ParallelMLP(fc, proj)
    x, w = data()
    n = dist.get_world_size()

    def step():
        with Profiled() as p:
            with p.window("forward"):
                y = mlp(x.clone().requires_grad_())
            with p.window("backward"):
                (y * w).sum().backward()
        return p

    box = []
    mean, _ = kernel_bytes(lambda: box.append(step()))
    fwd, bwd = (int(over_ranks(box[0].count("c10d::allreduce", k))) for k in ("forward", "backward"))
    want = 2 * 2 * B * S * H * 4 * (n - 1) / n
    return Verdict(fwd == 1 and bwd == 1 and within(mean, want, 0.99, 1.05),
                   f"all_reduces (torch's profiler): {fwd} forward, {bwd} backward (want 1 and 1); bytes per rank "
                   f"(the kernel's count) {kib(mean)}, {mean / want:.3f}x 2 x 2 b s h e (N-1)/N (want 0.99-1.05x)")


def activations(mod: ModuleType) -> Verdict:
    fc, proj = layers()
    mlp = mod.ParallelMLP(copy.deepcopy(fc), copy.deepcopy(proj))
    x, _ = data()
    x.requires_grad_()
    kept = {}
    for name, forward, holders in (("plain", lambda: plain(fc, proj, x), (fc, proj, x)), ("tp", lambda: mlp(x), (mlp, x))):
        with Memory(*holders) as mem:
            y = forward()                                    # kept: the graph and what it saved live on
        kept[name] = mem.kept - 4 * B * S * H                # less the output, alive in both
        del y
    n, tp_hidden = dist.get_world_size(), over_ranks(kept["tp"])
    return Verdict(tp_hidden * n <= 1.02 * kept["plain"] + 256,
                   f"the forward leaves {kib(tp_hidden)} of hidden activations alive per rank (torch's MemTracker; "
                   f"want 1/N of one process's {kib(kept['plain'])})")


CHECKS = {"tp": (Check("equal to one process", equals_one_process),
                 Check("weights split", sharded),
                 Check("communication", communication),
                 Check("activation memory", activations))}
