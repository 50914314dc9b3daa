"""The checks of the FSDP rung: per-parameter row shards, gathered per unit, with a compute dtype.

Equality is checked on the checker's TokenNet (an embedding of 29 rows, a LayerNorm of 11: rows
that split unevenly); bytes against (2 S_c + S)(N-1)/N with every parameter padded to N equal
pieces of ceil(rows / N) rows; memory on a stack of eight Linear(128, 128), where the parameters
dominate: ZeRO-3's 16 psi / N bytes left allocated per rank by construction and an AdamW step
(shards, their gradients, the state), and a step that never holds the whole model at once.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist.tutorial.check.instruments import Memory, kernel_bytes, over_ranks
from minidist.tutorial.check.models import mlp, my_slice, psi, seeded, token_loss, token_net, tokens
from minidist.tutorial.check.verdict import Check, Verdict, kib, within

K = 3
BYTES_DIMS = (64, 250, 250, 64)
"""0.14M parameters, 250 rows (padded to 252 at N = 4): gloo's headers (about 0.5 KB per call) stay small."""
WIDE = (128,) * 9
"""Eight Linear(128, 128): 0.13M parameters, activations of one row each: the parameters dominate."""


def padded_elements(module: nn.Module, n: int) -> int:
    """Elements once every parameter is padded to n pieces of ceil(rows / n) rows (what travels)."""
    return sum(-(-p.shape[0] // n) * n * (p.numel() // p.shape[0]) for p in module.parameters())


def step(model: nn.Module, k: int) -> None:
    idx, targets = tokens(8 * dist.get_world_size(), seed=50 + k)
    token_loss(model(my_slice(idx)), my_slice(targets)).backward()
    model.finish_gradient_synchronization()


def equals_one_process(mod: ModuleType) -> Verdict:
    reference, model = token_net(0), mod.FSDP(token_net(dist.get_rank()))   # ranks start different
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (reference, model)]
    for k in range(K):
        idx, targets = tokens(8 * dist.get_world_size(), seed=50 + k)
        token_loss(reference(idx), targets).backward()
        step(model, k)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    full = model.gather_full_params()
    names = dict(reference.named_parameters())
    if sorted(full) != sorted(names):
        return Verdict(False, f"gather_full_params() names {sorted(full)}; the module's are {sorted(names)}")
    err = over_ranks(max((full[n].float() - p).abs().max().item() for n, p in names.items()))
    return Verdict(err < 1e-5, f"after {K} AdamW steps in fp32: largest difference from one process on the whole "
                   f"batch {err:.1e} (want < 1e-5)")


def sharded(mod: ModuleType) -> Verdict:
    reference, model = token_net(0), mod.FSDP(token_net(0))
    n, mine = dist.get_world_size(), sum(p.numel() for p in model.parameters())
    summed, largest, bound = over_ranks(mine, dist.ReduceOp.SUM), over_ranks(mine), padded_elements(reference, n) / n
    return Verdict(summed == psi(reference) and largest <= bound,
                   f"the optimizer's parameters hold {int(largest)} elements on the largest rank (want at most "
                   f"{bound:.0f}, ceil(rows/N) rows of each) and {int(summed)} over the ranks (want {psi(reference)})")


def mlp_step(model: nn.Module) -> None:
    x = torch.randn(8, BYTES_DIMS[0], generator=seeded(dist.get_rank()))
    model(x).float().square().mean().backward()
    model.finish_gradient_synchronization()


def bytes_per_step(mod: ModuleType) -> Verdict:
    n, s = dist.get_world_size(), 4 * padded_elements(mlp(0, dims=BYTES_DIMS), dist.get_world_size())
    got, lines, ok = {}, [], True
    for name, dtype, s_c in (("fp32", None, s), ("bf16", torch.bfloat16, s // 2)):
        model = mod.FSDP(mlp(0, dims=BYTES_DIMS), compute_dtype=dtype)
        mlp_step(model)
        got[name], _ = kernel_bytes(lambda: mlp_step(model))
        want = (2 * s_c + s) * (n - 1) / n
        ok &= within(got[name], want, 0.99, 1.05)
        lines.append(f"{name} {kib(got[name])} = {got[name] / want:.3f}x (2 S_c + S)(N-1)/N")
    return Verdict(ok, "bytes written per rank and step (the kernel's count): " + ", ".join(lines) +
                   " (want 0.99-1.05x; S with padding)")


def bf16_masters(mod: ModuleType) -> Verdict:
    reference, model = token_net(0), mod.FSDP(token_net(0), compute_dtype=torch.bfloat16)
    idx, targets = tokens(8 * dist.get_world_size(), seed=60)
    token_loss(reference(idx), targets).backward()
    before = model.gather_full_params()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    token_loss(model(my_slice(idx)), my_slice(targets)).backward()
    model.finish_gradient_synchronization()
    masters = {p.dtype for p in model.parameters()}
    opt.step()
    after = model.gather_full_params()   # with lr 1, before - after is the gradient the optimizer used
    err = over_ranks(max(((before[n] - after[n]).float() - p.grad).abs().max().item() / p.grad.abs().max().item()
                         for n, p in reference.named_parameters()))
    return Verdict(masters == {torch.float32} and err < 0.05,
                   f"with bf16 compute the optimizer's parameters are {sorted(str(d) for d in masters)} (want fp32) "
                   f"and its gradients within {err:.1%} of fp32's (want < 5%)")


def memory(mod: ModuleType) -> Verdict:
    n = dist.get_world_size()
    x = torch.randn(1, WIDE[0])
    with Memory() as build:
        model = mod.FSDP(mlp(0, dims=WIDE))             # the module is built inside: its full parameters count
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(x).square().sum().backward()
        model.finish_gradient_synchronization()
        opt.step()
    opt.zero_grad(set_to_none=False)
    with Memory(model, opt) as one_step:
        model(x).square().sum().backward()
        model.finish_gradient_synchronization()
        opt.step()
    total = psi(mlp(0, dims=WIDE))
    kept, zero3 = over_ranks(build.kept), 16 * padded_elements(mlp(0, dims=WIDE), n) / n
    in_flight = 4 * padded_elements(mlp(0, dims=WIDE[:2]), n) / n   # one weight's shard, as a collective's buffer
    peak = over_ranks(one_step.extra)
    return Verdict(kept <= zero3 + in_flight + 1024 and peak < 4 * total,
                   f"construction + one AdamW step leave {kib(kept)} per rank, {kept / zero3:.3f}x ZeRO-3's 16 psi/N "
                   f"(torch's MemTracker; want at most that plus one shard a collective may still hold, "
                   f"{kib(in_flight)}); a step's peak above its start {kib(peak)} (want less than the whole model's "
                   f"fp32 parameters, {kib(4 * total)})")


CHECKS = {"fsdp": (Check("equal to one process", equals_one_process),
                   Check("parameters sharded", sharded),
                   Check("bytes per step", bytes_per_step),
                   Check("bf16 compute, fp32 masters", bf16_masters),
                   Check("memory", memory))}
