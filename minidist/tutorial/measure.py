"""What each step of the track costs, on one model: time, collectives, and bytes two ways.

    torchrun --standalone --nproc_per_node=2 -m minidist.tutorial.measure [--small]

Bytes per step and rank, counted twice: by minidist.comm.trace (what the ring model
says each collective sends) and by the kernel (minidist.comm.kernel_io: what this
process really wrote to its sockets, gloo's headers included). Times: the slowest
rank's best of several alternating rounds (best, because other work on a shared
machine only ever adds time). "+comm" is a step's time less the same step without
any communication: what the communication that did not hide behind backward cost.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import DDP, comm, runtime
from minidist.tutorial.ddp_bucketed import BucketedDDP
from minidist.tutorial.ddp_flat import FlatDDP
from minidist.tutorial.ddp_naive import NaiveDDP
from minidist.tutorial.ddp_overlap import OverlapDDP
from minidist.tutorial.fsdp import FSDP
from minidist.tutorial.model import make_model
from minidist.tutorial.sharded_optimizer import ShardedOptimizer
from minidist.tutorial.zero1 import ShardedOptimizer as PaperZeRO1

MB = 1e6
OPS = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "broadcast": "BC"}


class Plain(nn.Module):
    """No communication at all: the compute the other steps add to."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self) -> None:
        pass


class Engine(DDP):
    """minidist.DDP, the real engine: its gradients are averaged when backward returns."""

    def finish_gradient_synchronization(self) -> None:
        pass


def slowest(seconds: float) -> float:
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return t.item()


def one_step(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """forward, backward, finish_gradient_synchronization: (whole, after backward) seconds."""
    t0 = time.perf_counter()
    model(x).float().square().mean().backward()
    t1 = time.perf_counter()
    model.finish_gradient_synchronization()
    t2 = time.perf_counter()
    for p in model.parameters():
        p.grad = None
    return t2 - t0, t2 - t1


def counted(fn: Callable[[], object]) -> tuple[dict, int]:
    """Run fn once: the trace's totals per op, and the bytes the kernel saw this process write."""
    with comm.trace() as t, comm.kernel_io.written() as w:
        fn()
    return t.totals(), w.bytes


def best_times(steps: dict[str, Callable[[], tuple[float, float]]], rounds: int) -> dict[str, tuple[float, float]]:
    best = {name: (float("inf"), float("inf")) for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            dist.barrier()
            whole, after = steps[name]()
            best[name] = min(best[name], (whole, after))
    return {name: (slowest(a), slowest(b)) for name, (a, b) in best.items()}


def row(cells: list, widths: list[int]) -> str:
    return "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths)))


@dataclass
class Sizes:
    """The model and how long to measure."""

    width: int = 512
    depth: int = 8
    seconds: float = 0.005
    """Emulated forward compute per layer (backward: twice that)."""
    rounds: int = 9
    bucket_mb: float = 2.0


SMALL = Sizes(width=64, depth=4, seconds=0.002, rounds=2, bucket_mb=0.02)


def ddp_steps(sz: Sizes, x: torch.Tensor) -> dict[str, dict]:
    """Per DDP step: all_reduce calls, traced and kernel bytes, best times (whole step, after backward)."""
    make = lambda: make_model(sz.width, sz.depth, sz.seconds)  # noqa: E731
    models = {"no communication": Plain(make()), "1 naive": NaiveDDP(make()), "2 flat": FlatDDP(make()),
              "3 overlap": OverlapDDP(make()), f"4 buckets of {sz.bucket_mb:g} MiB": BucketedDDP(make(), sz.bucket_mb),
              f"minidist.DDP, {sz.bucket_mb:g} MiB": Engine(make(), bucket_cap_mb=sz.bucket_mb)}
    for m in models.values():  # warm up (minidist.DDP rebuilds its buckets after its first backward)
        one_step(m, x), one_step(m, x)
    out = {}
    for name, m in models.items():
        totals, kernel = counted(lambda m=m: one_step(m, x))
        ar = totals.get("all_reduce", {"calls": 0, "sent_bytes": 0})
        out[name] = {"calls": ar["calls"], "traced": ar["sent_bytes"], "kernel": kernel}
    times = best_times({name: (lambda m=m: one_step(m, x)) for name, m in models.items()}, sz.rounds)
    for name, (whole, after) in times.items():
        out[name].update(step_s=whole, after_s=after)
    return out


def zero_step(sz: Sizes, x: torch.Tensor) -> dict[str, dict]:
    """What each optimizer keeps and sends: AdamW after FlatDDP, the paper's ZeRO-1 (it reduces the
    gradients itself), the owner-broadcast variant after FlatDDP. Bytes from the end of backward
    through the optimizer step (the gradients' synchronisation included)."""
    out = {}
    for name, wrap, make_opt in (
            ("AdamW after DDP", FlatDDP, lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
            ("ZeRO-1, the paper", Plain, lambda ps: PaperZeRO1(ps, torch.optim.AdamW, lr=1e-3)),
            ("owner-broadcast after DDP", FlatDDP, lambda ps: ShardedOptimizer(ps, torch.optim.AdamW, lr=1e-3))):
        model = wrap(make_model(sz.width, sz.depth))
        opt = make_opt(model.parameters())

        def sync_and_step():
            model.finish_gradient_synchronization()
            opt.step()
        for _ in range(2):  # the first step creates the state
            model(x).square().mean().backward()
            totals, kernel = counted(sync_and_step)
            opt.zero_grad()
        state = (opt.local if isinstance(opt, (ShardedOptimizer, PaperZeRO1)) else opt).state
        nbytes = sum(v.numel() * v.element_size() for s in state.values() for v in s.values() if v.dim())
        out[name] = {"state": nbytes, "calls": " ".join(f"{OPS[op]}{t['calls']}" for op, t in totals.items()),
                     "traced": sum(t["sent_bytes"] for t in totals.values()), "kernel": kernel}
    return out


def fsdp_step(sz: Sizes, x: torch.Tensor) -> dict[str, dict]:
    """One FSDP step in fp32 and with bf16 compute: parameter bytes held, bytes per collective."""
    out = {}
    for name, dtype in (("fp32", None), ("bf16 compute", torch.bfloat16)):
        model = FSDP(make_model(sz.width, sz.depth, sz.seconds), compute_dtype=dtype)
        one_step(model, x)
        totals, kernel = counted(lambda: one_step(model, x))
        out[name] = {"held": sum(p.numel() * p.element_size() for p in model.parameters()),
                     "all_gather": totals["all_gather"]["sent_bytes"],
                     "reduce_scatter": totals["reduce_scatter"]["sent_bytes"], "kernel": kernel}
    return out


def report(sz: Sizes, parts: tuple[str, ...] = ("ddp", "zero", "fsdp")) -> None:
    """Measure `parts` and print their tables (rank 0), on an initialised process group."""
    say = print if dist.get_rank() == 0 else (lambda *a, **k: None)
    n = dist.get_world_size()
    x = torch.randn(16, sz.width, generator=torch.Generator().manual_seed(dist.get_rank()))
    params = sum(p.numel() for p in make_model(sz.width, sz.depth).parameters())
    s = 4 * params
    say(f"model: {sz.depth} x Linear({sz.width}, {sz.width}), {params} parameters, S = {s / MB:.3f} MB of fp32\n"
        f"gradients; N = {n} ranks; backward sleeps {2 * sz.seconds * 1e3:g} ms per layer (emulated compute)")
    if "ddp" in parts:
        ddp_table(sz, x, s, say)
    if "zero" in parts:
        zero_table(sz, x, s, say)
    if "fsdp" in parts:
        fsdp_table(sz, x, s, say)


def ddp_table(sz: Sizes, x: torch.Tensor, s: int, say: Callable) -> None:
    n = dist.get_world_size()
    say(f"\nDDP, step by step (every step sends 2 S (N-1)/N = {2 * s * (n - 1) / n / MB:.3f} MB per rank)")
    w = [24, 6, 10, 10, 8, 12]
    say(row(["step", "calls", "traced MB", "kernel MB", "step ms", "+comm ms"], w))
    rows = ddp_steps(sz, x)
    for name, r in rows.items():
        say(row([name, r["calls"], f"{r['traced'] / MB:.3f}", f"{r['kernel'] / MB:.3f}",
                 f"{r['step_s'] * 1e3:.1f}", f"{(r['step_s'] - rows['no communication']['step_s']) * 1e3:.1f}"], w))


def zero_table(sz: Sizes, x: torch.Tensor, s: int, say: Callable) -> None:
    n = dist.get_world_size()
    say(f"\nZeRO-1, the synchronisation and one optimizer step (AdamW's state: 8 bytes per parameter,\n"
        f"{2 * s / MB:.3f} MB in all; DDP sends 2 S (N-1)/N = {2 * s * (n - 1) / n / MB:.3f} MB)")
    w = [26, 10, 10, 10, 10]
    say(row(["optimizer", "state MB", "calls", "traced MB", "kernel MB"], w))
    for name, r in zero_step(sz, x).items():
        say(row([name, f"{r['state'] / MB:.3f}", r["calls"], f"{r['traced'] / MB:.3f}", f"{r['kernel'] / MB:.3f}"], w))


def fsdp_table(sz: Sizes, x: torch.Tensor, s: int, say: Callable) -> None:
    n = dist.get_world_size()
    say(f"\nFSDP, one step (held: parameter bytes kept between steps;\n"
        f"fp32 bytes: 3 S (N-1)/N = {3 * s * (n - 1) / n / MB:.3f} MB)")
    w = [16, 10, 12, 12, 10]
    say(row(["FSDP", "held MB", "gather MB", "scatter MB", "kernel MB"], w))
    for name, r in fsdp_step(sz, x).items():
        say(row([name, f"{r['held'] / MB:.3f}", f"{r['all_gather'] / MB:.3f}", f"{r['reduce_scatter'] / MB:.3f}",
                 f"{r['kernel'] / MB:.3f}"], w))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a small model and few rounds (what the tests run)")
    ap.add_argument("--part", choices=("ddp", "zero", "fsdp"), action="append",
                    help="measure only this part (repeatable; default: all three)")
    args = ap.parse_args(argv)
    try:
        with runtime.distributed("gloo"):
            torch.set_num_threads(1)
            report(SMALL if args.small else Sizes(), tuple(args.part or ("ddp", "zero", "fsdp")))
    except Exception as exc:  # noqa: BLE001 - one line per rank (MINIDIST_TRACEBACK=1 for the trace)
        runtime.exit_on_error(exc)
    runtime.exit_process(0)


if __name__ == "__main__":
    main()
