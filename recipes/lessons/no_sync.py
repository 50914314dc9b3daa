"""`no_sync`: DDP reads it in forward, FSDP in backward; around both is right for both.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.no_sync

Gradient accumulation over K micro-batches needs one gradient reduction, not K:
the first K-1 backwards should only add into p.grad. Where the engine reads the
no_sync flag decides what the context manager must cover.

DDP (torch's DistributedDataParallel and minidist.DDP) reads it in *forward*:
DDP.forward hands it to Reducer.prepare_for_forward, which arms or disarms the
reducer for the backward to come. So no_sync around the backward alone does
nothing (the forward ran outside and armed the reducer), and around the forward
alone is enough:

    with model.no_sync():                    # right for every engine
        loss = model(x); loss.backward()

    loss = model(x)                          # DDP: the forward ran outside, the reducer
    with model.no_sync():                    # is armed, and this backward all_reduces
        loss.backward()                      # anyway (FSDP: right)

minidist.FSDP reads it in each unit's *post_backward*, when the unit's gradients
exist and their reduce_scatter would start (minidist.fsdp.unit), and once more at
the end of backward: around the backward alone is enough there, around the forward
alone does nothing. (torch's FSDP2 has no context manager: set_requires_gradient_sync
is read in its post_backward too.)

A wrong form is silent: the gradient is still right (averaging is linear, so
reducing every micro-batch and summing gives the same result), only the bytes and
the time are K times larger. This lesson counts, for each form, the micro-batches
whose backward reduced gradients (minidist.comm.trace; a counting comm hook for
torch's DDP), the bytes each process wrote (the kernel's count, which for FSDP
includes its all_gathers), and compares the gradient with one process on the whole
batch.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minidist import DDP, FSDP, comm
from recipes.lessons.common import Context, kernel_bytes, main_for

TITLE = "DDP reads no_sync in forward, FSDP in backward"

CLAIM = ("around the backward only, DDP still reduces all {k} micro-batches ({ddp_bwd:.1f} MiB written, as "
         "without no_sync) and FSDP once; around the forward only, DDP reduces once and FSDP {k} times; around "
         "both, each reduces once ({ddp_both:.1f} MiB for DDP), with the gradient of one process on the whole "
         "batch (error {err:.0e}); torch's DDP behaves as minidist's")

FORMS = {
    "forward+backward": (True, True),
    "forward only": (True, False),
    "backward only": (False, True),
    "not at all": (False, False),
}
"""Which of (forward, backward) of the first K-1 micro-batches run inside no_sync."""

ENGINES = ("minidist DDP", "torch DDP", "minidist FSDP")

EXPECTED = {  # micro-batches whose backward reduces, out of K: where each engine reads the flag
    "DDP": {"forward+backward": 1, "forward only": 1, "backward only": "K", "not at all": "K"},
    "FSDP": {"forward+backward": 1, "forward only": "K", "backward only": 1, "not at all": "K"},
}


def accumulate(model, xs, ys, in_fwd: bool, in_bwd: bool, reduced) -> int:
    """K micro-batches; returns how many backwards reduced gradients (`reduced(backward)` tells)."""
    k, count = len(xs), 0
    for i, (x, y) in enumerate(zip(xs, ys)):
        last = i == k - 1
        fctx = model.no_sync() if in_fwd and not last else contextlib.nullcontext()
        bctx = model.no_sync() if in_bwd and not last else contextlib.nullcontext()
        with fctx:
            loss = nn.functional.mse_loss(model(x), y) / k
        with bctx:
            count += reduced(loss.backward)
    return count


def traced_reduction(backward) -> bool:
    """Run backward; did it issue a gradient reduction (minidist engines)?"""
    with comm.trace() as t:
        backward()
    return any(r.op in ("all_reduce", "reduce_scatter") for r in t.records)


def local_grad(engine: str, model: nn.Module) -> torch.Tensor:
    """This rank's gradient as one flat vector: everything (DDP), or this rank's rows of every parameter's (FSDP)."""
    params = model.module.parameters() if engine.endswith("DDP") else model.parameters()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def run_form(engine: str, net: nn.Module, xs, ys, form: str) -> tuple[int, float, torch.Tensor, nn.Module]:
    in_fwd, in_bwd = FORMS[form]
    if engine == "torch DDP":
        model = TorchDDP(copy.deepcopy(net))
        counted: list[int] = []
        model.register_comm_hook(dist.group.WORLD, _counting_hook(counted))

        def reduced(backward) -> bool:
            before = len(counted)
            backward()
            return len(counted) > before
    else:
        model = DDP(copy.deepcopy(net)) if engine == "minidist DDP" else FSDP(copy.deepcopy(net))
        reduced = traced_reduction
    box = {}
    written = kernel_bytes(lambda: box.update(n=accumulate(model, xs, ys, in_fwd, in_bwd, reduced)))
    return box["n"], written, local_grad(engine, model), model


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
    want = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    rows, seen, ok = [], {}, True
    for engine in ENGINES:
        for form in FORMS:
            count, written, grad, model = run_form(engine, net, xs, ys, form)
            if engine == "minidist FSDP":  # this rank's rows of every parameter's gradient (p.shard_spec)
                grads = dict(ref.named_parameters())
                want_here = torch.cat([grads[p.shard_spec.fqn].grad[slice(*p.shard_spec.row_range())].reshape(-1)
                                       for p in model.parameters()])
            else:
                want_here = want
            err = (grad - want_here).abs().max().item()
            expected = EXPECTED[engine.split()[-1]][form]
            ok &= count == (k if expected == "K" else expected) and err < 1e-5
            seen[engine, form] = (written, err)
            rows.append([engine, form, f"{count} of {k}", written / 2**20, f"{err:.1e}"])
    ctx.say(f"K = {k} micro-batches per rank, N = {n}, S = {S / 2**20:.2f} MiB of gradients; no_sync around the "
            f"first K-1 micro-batches; reduced: micro-batches whose backward reduced gradients; written: bytes per "
            f"rank the kernel saw (FSDP's include its all_gathers); error = max |grad - one process on the whole batch|")
    ctx.table(["engine", "no_sync covers", "reduced", "written MiB", "error"], rows)
    ddp = {form: seen["minidist DDP", form][0] for form in FORMS}
    ok &= abs(ddp["backward only"] / ddp["forward+backward"] - k) < 0.01 * k
    ok &= all(abs(seen["torch DDP", f][0] / ddp[f] - 1) < 0.01 for f in FORMS)
    ctx.claim(CLAIM.format(k=k, ddp_bwd=ddp["backward only"] / 2**20, ddp_both=ddp["forward+backward"] / 2**20,
                           err=max(e for _, e in seen.values())), ok)


def _counting_hook(counted: list[int]):
    """torch's default all_reduce hook, counting the bytes of each bucket it reduces."""
    def hook(state, bucket):
        counted.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(state, bucket)
    return hook


if __name__ == "__main__":
    main_for(run, TITLE)
