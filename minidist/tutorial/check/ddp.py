"""The checks of the four DDP rungs: naive, flat, overlapped, bucketed.

Each wraps the checker's MLP (minidist.tutorial.check.models) in the learner's class, trains it
beside one process on the whole batch, and measures one step three ways: collectives by torch's
profiler, bytes by the kernel, memory by the profiler's allocator events. What every rung must
send is DDP's 2 S (N-1)/N per rank and step (S: the gradients' bytes); what differs is how many
collectives carry it, when they start, and what extra memory they need.
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

CLASSES = {"ddp_naive": "NaiveDDP", "ddp_flat": "FlatDDP", "ddp_overlap": "OverlapDDP", "ddp_bucketed": "BucketedDDP"}
BYTES_DIMS = (64, 250, 250, 64)
"""0.14M parameters, 0.56 MB of gradients: gloo's headers (about 0.5 KB per call) stay a few percent."""
SMALL_CAP_MB = 0.004
"""4 KiB buckets: several buckets for the MLP's 14 KB of gradients, fewer than its 8 tensors."""
K = 3


def wrap(mod: ModuleType, rung: str, module: nn.Module, cap_mb: float = SMALL_CAP_MB) -> nn.Module:
    cls = getattr(mod, CLASSES[rung])
    return cls(module, bucket_size_mb=cap_mb) if rung == "ddp_bucketed" else cls(module)


def batch(step: int, dims=(13, 5)) -> tuple[torch.Tensor, torch.Tensor]:
    n = 8 * dist.get_world_size()
    return torch.randn(n, dims[0], generator=seeded(10 + step)), torch.randn(n, dims[-1], generator=seeded(20 + step))


def train_step(model: nn.Module, step: int, sync: bool = True, dims=(13, 5)) -> None:
    x, y = batch(step, dims)
    nn.functional.mse_loss(model(my_slice(x)), my_slice(y)).backward()
    if sync:
        model.finish_gradient_synchronization()


def grad_bytes(module: nn.Module) -> int:
    return 4 * psi(module)


def starts_from_rank0(rung: str, mod: ModuleType) -> Verdict:
    reference, inner = mlp(0), mlp(dist.get_rank())       # the ranks start different
    wrap(mod, rung, inner)
    diff = over_ranks(max((a - b).abs().max().item() for a, b in zip(inner.parameters(), reference.parameters())))
    return Verdict(diff == 0, f"after construction, largest difference from rank 0's values {diff:.1e} (want 0)")


def equals_one_process(rung: str, mod: ModuleType) -> Verdict:
    reference, inner = mlp(0), mlp(dist.get_rank())
    model = wrap(mod, rung, inner)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, inner)]
    start = [p.detach().clone() for p in reference.parameters()]
    for k in range(K):
        x, y = batch(k)
        nn.functional.mse_loss(reference(x), y).backward()
        train_step(model, k)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    err = over_ranks(max((a - b).abs().max().item() for a, b in zip(inner.parameters(), reference.parameters())))
    moved = min((p - s).abs().max().item() for p, s in zip(reference.parameters(), start))
    return Verdict(err < 1e-5 and moved > 1e-4, f"after {K} SGD steps at N = {dist.get_world_size()}: largest "
                   f"difference from one process on the whole batch {err:.1e} (want < 1e-5)")


def all_reduces(rung: str, mod: ModuleType) -> Verdict:
    inner = mlp(0)
    tensors = len(list(inner.parameters()))
    counts = {}
    caps = (SMALL_CAP_MB, 1.0) if rung == "ddp_bucketed" else (SMALL_CAP_MB,)
    for cap in caps:
        model = wrap(mod, rung, mlp(0), cap)
        train_step(model, 0)                                  # a first step: anything lazy is built
        with Profiled() as p:
            with p.window("step"):
                train_step(model, 1)
        counts[cap] = int(over_ranks(p.count("c10d::allreduce", "step")))
    got = counts[SMALL_CAP_MB]
    if rung == "ddp_bucketed":
        ok = 1 < got < tensors and counts[1.0] <= 2
        return Verdict(ok, f"{got} with {SMALL_CAP_MB:g} MiB buckets (torch's profiler; "
                       f"want more than 1, fewer than the {tensors} tensors), {counts[1.0]} with 1 MiB ones (want 1 or 2)")
    want = 1 if rung == "ddp_flat" else tensors
    return Verdict(got == want, f"{got} (torch's profiler; want {want})")


def bytes_per_step(rung: str, mod: ModuleType) -> Verdict:
    model = wrap(mod, rung, mlp(0, dims=BYTES_DIMS), cap_mb=0.25)
    train_step(model, 0, dims=BYTES_DIMS)
    mean, _ = kernel_bytes(lambda: train_step(model, 1, dims=BYTES_DIMS))
    n = dist.get_world_size()
    want = 2 * grad_bytes(mlp(0, dims=BYTES_DIMS)) * (n - 1) / n
    return Verdict(within(mean, want, 0.99, 1.05), f"{kib(mean)} written per rank (the kernel's count), "
                   f"{mean / want:.3f}x 2 S (N-1)/N = {kib(want)} (want 0.99-1.05x: gloo's headers)")


def overlaps_backward(rung: str, mod: ModuleType) -> Verdict:
    model = wrap(mod, rung, mlp(0, seconds=0.004))
    train_step(model, 0)
    with Profiled() as p:
        train_step(model, 1)
    issued = p.starts("c10d::allreduce")
    last_layer = max(p.starts("check:backward"))             # the last sleeping layer's backward to start
    ahead = (last_layer - min(issued)) / 1e6 if issued else float("-inf")
    ahead = over_ranks(ahead, dist.ReduceOp.MIN)
    return Verdict(ahead > 0, f"the first all_reduce started {ahead:.1f} ms before the last layer's backward "
                   f"(torch's profiler; want > 0: it must not wait for backward to end)")


def extra_memory(rung: str, mod: ModuleType) -> Verdict:
    plain, model = mlp(0), wrap(mod, rung, mlp(0))
    for m in (plain, model):
        m.train()
    train_step(plain, 0, sync=False)
    train_step(model, 0)
    extra = {}
    for name, m in (("plain", plain), ("wrapped", model)):
        for q in m.parameters():
            q.grad = None
        with Memory(m) as mem:
            train_step(m, 1, sync=m is model)
        extra[name] = mem.extra
    extra = over_ranks(extra["wrapped"] - extra["plain"])
    largest = max(4 * q.numel() for q in plain.parameters())
    bound, what = (largest, "the largest gradient") if rung == "ddp_naive" else (grad_bytes(plain), "S, one copy")
    return Verdict(extra <= bound + 1024, f"backward + synchronisation peak {kib(extra)} above a plain backward's "
                   f"(torch's MemTracker; want at most {what}, {kib(bound)})")


def checks(rung: str) -> tuple[Check, ...]:
    out = [Check("starts from rank 0's values", functools.partial(starts_from_rank0, rung)),
           Check("equal to one process", functools.partial(equals_one_process, rung)),
           Check("all_reduces per step", functools.partial(all_reduces, rung))]
    if rung in ("ddp_overlap", "ddp_bucketed"):
        out.append(Check("overlaps backward", functools.partial(overlaps_backward, rung)))
    out += [Check("bytes per step", functools.partial(bytes_per_step, rung)),
            Check("memory", functools.partial(extra_memory, rung))]
    return tuple(out)


CHECKS = {rung: checks(rung) for rung in CLASSES}
