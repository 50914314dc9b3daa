"""minidist.DDP against torch's DistributedDataParallel: step time, and how much of the
all_reduce the backward hides.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/ddp_vs_torch.py
    ... benchmarks/ddp_vs_torch.py --sleep-ms 0 20 --buckets 1 5 25 100 --repeats 6

Same model, same data, same bucket_cap_mb (the same buckets, except that
minidist caps its last bucket at min(1 MiB, cap): the "buckets" column shows
both engines' counts), world 2, gloo on the CPU. For
every bucket size and backward-sleep setting, minidist and torch steps are
interleaved (minidist, torch, minidist under no_sync, torch under no_sync,
repeated; the two swap places every repeat) after warm-up steps (both rebuild
their buckets after the first), so machine noise hits both alike.

Why a sleeping backward: with 2 ranks on 2 cores, gloo's threads compete with
the backward matmuls for the same cores, so no overlap is visible. A layer whose
backward sleeps (as PyTorch's own FSDP tests inject delays) emulates accelerator
compute that leaves the CPU free for communication.

Columns:
  buckets  number of buckets, minidist/torch (after both rebuilt them in ready order)
  ratio    median minidist step / median torch step (goal <= 1.00); an even number of
           repeats, so that each engine goes first equally often
  comm     the all_reduce time of all buckets alone (blocking, back to back)
  overhead step time minus the same step under no_sync (communication skipped), median of
           the paired differences
  hidden   minidist.comm.hidden_share(overhead, comm) = 1 - overhead / comm (the one definition,
           minidist/comm/trace.py): the share of the all_reduce that the backward hides,
           minidist's then torch's (goal: >= torch's, and >= 90% where the backward compute >= comm)
  host+    main-thread CPU time that synchronising adds to a step (thread time, synced step
           minus no_sync step, medians), minidist's then torch's: copies, scaling, launches,
           hooks. With a sleeping backward this host work sits on the critical path and no
           overlap can hide it; it moves much less than wall time when the machine is loaded.
  during+  where the overhead goes, part 1: the time from the start of backward to the
           last gradient computed (the input layer's weight), synced minus no_sync (paired):
           host work in the hooks, and compute slowed by communication threads sharing the cores
  after    part 2: from that gradient to the end of backward (synced steps): the last
           bucket's all_reduce, waiting for earlier ones still in flight, copies into p.grad

Numbers taken on a loaded machine are noisy (gloo's threads then wait for a core): compare
the engines within one run, and repeat a run before concluding.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minidist import comm, runtime
from minidist.ddp import DDP


class _SleepInBackward(torch.autograd.Function):
    """Identity forward; backward sleeps `seconds` (emulated accelerator compute, CPU left idle)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class Net(nn.Module):
    """Linear(d_in, width), then `layers` blocks of [sleeping backward, Linear(width, width), tanh].

    The sleep sits *before* each block's Linear, so in backward it runs right
    after that Linear's gradients are ready: the bucket holding them can
    travel while the next (earlier) layer "computes". The small input layer
    makes the last bucket to fill small, as in a real network whose earliest
    layers still compute after the big ones are done.
    """

    def __init__(self, d_in: int, width: int, layers: int, sleep_ms: float):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.sleep_s = sleep_ms / 1e3

    def note_last_gradient(self) -> None:
        """Record when the input layer's weight gradient is computed (the last one, in backward)."""
        self.last_grad_at = 0.0
        self.inp.weight.register_hook(lambda g: setattr(self, "last_grad_at", time.perf_counter()))

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            if self.sleep_s:
                x = _SleepInBackward.apply(x, self.sleep_s)
            x = torch.tanh(block(x))
        return x


@dataclass
class Step:
    wall: float
    host: float
    """Main-thread CPU seconds."""
    during: float
    """From the start of backward to the last gradient computed (the input layer's weight)."""
    after: float
    """From that gradient to the end of backward: what only the last bucket's all_reduce should fill."""


def step_time(model, opt, x, y, sync: bool) -> Step:
    c0, t0 = time.thread_time(), time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with contextlib.nullcontext() if sync else model.no_sync():
        loss = F.mse_loss(model(x), y)
        b0 = time.perf_counter()
        loss.backward()
        b1 = time.perf_counter()
    opt.step()
    last = model.module.last_grad_at
    return Step(time.perf_counter() - t0, time.thread_time() - c0, last - b0, b1 - last)


def comm_time(model: DDP) -> float:
    """All buckets all_reduced back to back, blocking, no compute: the communication to hide."""
    t0 = time.perf_counter()
    for bucket in model.reducer.buckets:
        comm.all_reduce(bucket.buffer())
    return time.perf_counter() - t0


def measure(args, bucket_mb: float, sleep_ms: float, rank: int) -> dict:
    torch.manual_seed(0)
    base = Net(args.d_in, args.width, args.layers, sleep_ms)
    view = args.gradient_as_bucket_view
    ours = DDP(copy.deepcopy(base), bucket_cap_mb=bucket_mb, gradient_as_bucket_view=view)
    theirs = TorchDDP(copy.deepcopy(base), bucket_cap_mb=bucket_mb, gradient_as_bucket_view=view)
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in (("ours", ours), ("torch", theirs))}
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.batch, args.d_in, generator=g), torch.randn(args.batch, args.width, generator=g)
    models = {"ours": ours, "torch": theirs}
    for m in models.values():
        m.module.note_last_gradient()
    for _ in range(3):  # warm up; both rebuild their buckets after the first step
        for name in models:
            step_time(models[name], opts[name], x, y, True)
    steps: dict[str, list[Step]] = {k: [] for k in ("ours", "torch", "ours_nosync", "torch_nosync")}
    comm_s = []
    for rep in range(args.repeats):
        order = ["ours", "torch"] if rep % 2 == 0 else ["torch", "ours"]  # neither always goes first
        for name in order:
            steps[name].append(step_time(models[name], opts[name], x, y, True))
        for name in order:
            steps[name + "_nosync"].append(step_time(models[name], opts[name], x, y, False))
        comm_s.append(comm_time(ours))
    med = {k: statistics.median(s.wall for s in v) for k, v in steps.items()}
    comm_med = statistics.median(comm_s)

    def paired(name: str, field: str) -> float:
        """Median of (synced step - the no_sync step right after it): slow drift cancels."""
        return statistics.median(getattr(s, field) - getattr(n, field)
                                 for s, n in zip(steps[name], steps[name + "_nosync"]))

    r = dict(bucket_mb=bucket_mb, sleep_ms=sleep_ms, ours=med["ours"], torch=med["torch"],
             ratio=med["ours"] / med["torch"], comm=comm_med, compute=med["ours_nosync"],
             n_buckets=len(ours.reducer.buckets),
             n_buckets_torch=theirs._get_ddp_logging_data().get("num_buckets_reduced", -1))
    for name, suffix in (("ours", ""), ("torch", "_torch")):
        overhead = paired(name, "wall")
        r.update({"overhead" + suffix: overhead, "hidden" + suffix: comm.hidden_share(overhead, comm_med),
                  "host" + suffix: statistics.median(s.host for s in steps[name])
                  - statistics.median(s.host for s in steps[name + "_nosync"]),
                  "during" + suffix: paired(name, "during"),
                  "after" + suffix: statistics.median(s.after for s in steps[name])})
    return r



_PAIRS = (("overhead ms", "overhead", 1e3, ".1f"), ("hidden", "hidden", 1, ".0%"), ("host+ ms", "host", 1e3, ".1f"),
          ("during+ ms", "during", 1e3, ".1f"), ("after ms", "after", 1e3, ".1f"))


def _header() -> str:
    first = (f"{'sleep ms':>8} {'bucket MB':>9} {'buckets':>7} {'minidist ms':>11} {'torch ms':>9} {'ratio':>6} "
             f"{'compute ms':>10} {'comm ms':>8} " + " ".join(f"{title:>11}" for title, *_ in _PAIRS))
    second = f"{'':>8} {'':>9} {'md/torch':>7} {'':>11} {'':>9} {'':>6} {'':>10} {'':>8} " + " ".join(
        f"{'md/torch':>11}" for _ in _PAIRS)
    return first + "\n" + second


def _row(r: dict) -> str:
    def pair(key: str, scale: float, fmt: str) -> str:
        return f"{r[key] * scale:{fmt}}/{r[key + '_torch'] * scale:{fmt}}"
    pairs = " ".join(f"{pair(key, scale, fmt):>11}" for _, key, scale, fmt in _PAIRS)
    buckets = f"{r['n_buckets']}/{r['n_buckets_torch']}"
    return (f"{r['sleep_ms']:>8g} {r['bucket_mb']:>9g} {buckets:>7} {r['ours'] * 1e3:>11.1f} "
            f"{r['torch'] * 1e3:>9.1f} {r['ratio']:>6.2f} {r['compute'] * 1e3:>10.1f} {r['comm'] * 1e3:>8.1f} {pairs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-in", type=int, default=64)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8, help="Linear(width, width) blocks")
    parser.add_argument("--batch", type=int, default=32, help="rows per rank")
    parser.add_argument("--sleep-ms", type=float, nargs="+", default=[0.0, 20.0],
                        help="backward sleep per block (emulated accelerator compute); 0 = pure CPU")
    parser.add_argument("--buckets", type=float, nargs="+", default=[1, 5, 25, 100], help="bucket_cap_mb values")
    parser.add_argument("--repeats", type=int, default=16, help="even: both engines go first equally often")
    parser.add_argument("--gradient-as-bucket-view", action="store_true", help="for both minidist and torch")
    args = parser.parse_args()
    with runtime.distributed("gloo") as topo:
        torch.set_num_threads(1)
        grad_mb = (args.layers * (args.width + 1) + args.d_in + 1) * args.width * 4 / 2**20
        if topo.is_main:
            print(f"world {topo.world_size}, gloo/CPU, Linear({args.d_in}, {args.width}) + {args.layers} x Linear({args.width}, {args.width}): "
                  f"{grad_mb:.1f} MiB of gradients, batch {args.batch}/rank, median of {args.repeats} "
                  f"interleaved steps\n")
            print(_header())
        ratios = []
        for sleep_ms in args.sleep_ms:
            for bucket_mb in args.buckets:
                r = measure(args, bucket_mb, sleep_ms, topo.rank)
                ratios.append(r["ratio"])
                if topo.is_main:
                    print(_row(r), flush=True)
        if topo.is_main:
            print(f"\nstep-time ratio minidist/torch, median over all rows: {statistics.median(ratios):.2f}")
            print("compute = the step under no_sync (no communication); hidden = 1 - overhead / comm "
                  "(minidist.comm.hidden_share)")


if __name__ == "__main__":
    main()
