"""`no_sync` must cover the forward too: DDP decides in forward whether the coming backward syncs.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.no_sync

Gradient accumulation over K micro-batches needs one all_reduce, not K: the first
K-1 backwards should only add into p.grad. Both torch's DistributedDataParallel
and minidist.DDP read the no_sync flag in *forward* (DDP.forward hands it to
Reducer.prepare_for_forward), because that is where the reducer is armed for the
backward to come. So

    with model.no_sync():                    # right: forward and backward inside
        loss = model(x); loss.backward()

    loss = model(x)                          # wrong: the forward ran outside, the
    with model.no_sync():                    # reducer is armed, and this backward
        loss.backward()                      # all_reduces anyway

The wrong form is silent: the gradient is still right (averaging is linear, so
syncing every micro-batch and summing gives the same result), only the bytes and
the time are K times larger. This lesson counts the all_reduces under each form,
for minidist (minidist.comm.trace) and for torch (a counting comm hook), and
compares the gradient with one process on the whole batch.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minidist import DDP, comm
from recipes.lessons.common import Context, main_for

TITLE = "no_sync around backward only vs around forward+backward"

FORMS = {
    "forward+backward": (True, True),
    "backward only": (False, True),
    "not at all": (False, False),
}
"""Which of (forward, backward) of the first K-1 micro-batches run inside no_sync."""


def accumulate(model, xs, ys, in_fwd: bool, in_bwd: bool) -> None:
    k = len(xs)
    for i, (x, y) in enumerate(zip(xs, ys)):
        last = i == k - 1
        fctx = model.no_sync() if in_fwd and not last else contextlib.nullcontext()
        bctx = model.no_sync() if in_bwd and not last else contextlib.nullcontext()
        with fctx:
            loss = nn.functional.mse_loss(model(x), y) / k
        with bctx:
            loss.backward()


def grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def run(ctx: Context) -> None:
    n, k = ctx.world, 4
    width = 256 if ctx.small else 1024
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
    S = sum(p.numel() * 4 for p in net.parameters())
    data = torch.Generator().manual_seed(1)
    xs_all = torch.randn(n, k, 8, width, generator=data)     # [rank, micro-batch, rows, width]
    ys_all = torch.randn(n, k, 8, width, generator=data)
    xs, ys = list(xs_all[ctx.rank]), list(ys_all[ctx.rank])
    # One process on the whole batch: every rank's every micro-batch, one backward.
    ref = copy.deepcopy(net)
    nn.functional.mse_loss(ref(xs_all.transpose(0, 1).reshape(-1, width)),
                           ys_all.transpose(0, 1).reshape(-1, width)).backward()
    want = grads(ref)
    rows, seen = [], {}
    for engine in ("minidist", "torch"):
        for form, (in_fwd, in_bwd) in FORMS.items():
            if engine == "minidist":
                model = DDP(copy.deepcopy(net))
                with comm.trace() as t:
                    accumulate(model, xs, ys, in_fwd, in_bwd)
                calls = sum(r.op == "all_reduce" for r in t.records)
                sent = sum(r.sent_bytes for r in t.records if r.op == "all_reduce")
            else:
                model = TorchDDP(copy.deepcopy(net))
                counted: list[int] = []
                model.register_comm_hook(dist.group.WORLD, _counting_hook(counted))
                accumulate(model, xs, ys, in_fwd, in_bwd)
                calls, sent = len(counted), sum(2 * b * (n - 1) // n for b in counted)
            err = (grads(model.module) - want).abs().max().item()
            seen[engine, form] = (sent, err)
            rows.append([engine, form, calls, sent / 2**20, f"{err:.1e}"])
    ctx.say(f"K = {k} micro-batches per rank, N = {n}, S = {S / 2**20:.2f} MiB of gradients; no_sync around the "
            f"first K-1 micro-batches; error = max |grad - one process on the whole batch|")
    ctx.table(["engine", "no_sync covers", "all_reduce calls", "sent MiB", "error"], rows)
    right, wrong = seen["minidist", "forward+backward"], seen["minidist", "backward only"]
    ctx.claim(f"no_sync around backward only sends {wrong[0] / right[0]:.0f}x the bytes of no_sync around "
              f"forward+backward ({wrong[0] / 2**20:.1f} vs {right[0] / 2**20:.1f} MiB), the same as no no_sync at "
              f"all, with the same gradient (error {wrong[1]:.0e}); torch's DDP behaves alike",
              wrong[0] == k * right[0] == seen["minidist", "not at all"][0]
              and all(e < 1e-5 for _, e in seen.values())
              and seen["torch", "backward only"][0] == wrong[0] and seen["torch", "forward+backward"][0] == right[0])


def _counting_hook(counted: list[int]):
    """torch's default all_reduce hook, counting the bytes of each bucket it reduces."""
    def hook(state, bucket):
        counted.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(state, bucket)
    return hook


if __name__ == "__main__":
    main_for(run, TITLE)
