"""DDP's bucket size: how many all_reduces, when the first one starts, and the step time.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.bucket_sweep

Backward produces gradients last layer first. minidist.DDP packs them into
buckets in that order (minidist.ddp.assign_buckets) and all_reduces a bucket as
soon as its last gradient arrives, while backward goes on computing earlier
layers. The bucket cap trades two costs: small buckets pay the per-call latency
alpha many times; big buckets start late, because a bucket cannot travel until
all of its gradients exist. A single bucket holding everything cannot start
before backward has finished, so nothing overlaps.

That is why the first bucket is small: with bucket_cap_mb left at its default,
bucket 0 closes at 1 MiB (torch's _DEFAULT_FIRST_BUCKET_BYTES), so the wire is
busy after the last layer's backward instead of after most of the model.
The model's backward sleeps (emulated accelerator compute), so the overlap is
real on two CPU cores.

What is checked, and how. The bucket layout comes from the reducer's buckets.
When the first all_reduce is issued is read two ways: as an order (how many of
the sleeping layers' backwards had still to start when it was issued: the
comm.trace issue time against a log of the sleeps, on one clock; no load can
change an order), and in ms after backward started (the clock's part: load
only ever delays it, so the best of a few runs is shown).
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from minidist import DDP, comm
from recipes.lessons.common import Context, SleepLinear, compute_log, interleaved_times, main_for, max_over_ranks

TITLE = "DDP bucket size sweep: buckets, first launch, step time"

CLAIM = ("with the default 1 MiB first bucket the first all_reduce is issued while {left_default} of the {sleeps} "
         "sleeping layers' backwards are still to run ({ms_default:.0f} ms into backward); with a {big:g} MB cap "
         "the first bucket holds {first_big:.1f} of {total:.1f} MiB and is issued with {left_big} left "
         "({ms_big:.0f} ms)")


def build(width: int, layers: int, seconds: float, cap_mb):
    torch.manual_seed(0)
    net = nn.Sequential(*(SleepLinear(width, seconds, backward_only=True) for _ in range(layers)))
    model = DDP(net, bucket_cap_mb=cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, opt


def step(model, opt, x) -> None:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def first_launch(model, opt, x, repeats: int) -> tuple[float, int, int, int]:
    """The first all_reduce of a backward: least ms after backward started (best case: load only
    ever delays it), fewest and most sleeping backwards still to start when it was issued, and
    how many sleeping backwards one backward runs."""
    samples, left = [], []
    for _ in range(repeats):
        loss = model(x).square().mean()
        with comm.trace() as t, compute_log() as log:
            t0 = time.perf_counter()
            loss.backward()
        issued = min(r.issued_s for r in t.records if r.op == "all_reduce")
        samples.append(issued - t0)
        left.append(sum(s > issued for s in log.backward))
        opt.step()
        opt.zero_grad(set_to_none=True)
    fewest, most = -max_over_ranks(-min(left)), max_over_ranks(max(left))
    return max_over_ranks(min(samples)) * 1e3, int(fewest), int(most), len(log.backward)


def bucket_mib(model) -> list[float]:
    """MiB of gradients in each bucket, in launch order (the layout after the rebuild)."""
    return [sum(b.numels) * b.params[0].element_size() / 2**20 for b in model.reducer.buckets]


def sizes(small: bool) -> tuple[int, int, float, list]:
    """width, layers, seconds of forward sleep (backward sleeps twice that), bucket caps."""
    return (512, 4, 0.004, [None, 64.0]) if small else (512, 8, 0.004, [None, 1.0, 3.0, 64.0])


def run(ctx: Context) -> None:
    width, layers, seconds, caps = sizes(ctx.small)     # 1 MiB per weight
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(ctx.rank))
    grad_mib = layers * (width + 1) * width * 4 / 2**20
    models = {cap: build(width, layers, seconds, cap) for cap in caps}
    for model, opt in models.values():      # the first backward records the ready order; buckets rebuilt after
        step(model, opt, x)
    times = interleaved_times({cap: (lambda m=m: step(*m, x)) for cap, m in models.items()},
                              repeats=3 if ctx.small else 6, stat=min)
    rows, launch = [], {}
    for cap, (model, opt) in models.items():
        mib = bucket_mib(model)
        launch[cap] = first_launch(model, opt, x, 2 if ctx.small else 3)
        rows.append(["default (None)" if cap is None else cap, len(mib), mib[0], max(mib), launch[cap][1],
                     launch[cap][0], times[cap] * 1e3])
    sleeps = launch[None][3]
    ctx.say(f"{layers} x Linear({width}, {width}): {grad_mib:.1f} MiB of gradients, N = {ctx.world}; backward "
            f"sleeps {2 * seconds * 1e3:.0f} ms in each of the {sleeps} layers above the first (the input needs "
            f"no gradient); layers left: sleeping backwards not yet started when the first all_reduce was issued")
    ctx.table(["bucket_cap_mb", "buckets", "first MiB", "largest MiB", "layers left", "first launch ms",
               "best step ms"], rows)
    big = caps[-1]
    first_big = rows[-1][2]  # MiB in the first bucket at the big cap: all but minidist's small last bucket
    (ms_default, left_default, _, _), (ms_big, _, left_big, _) = launch[None], launch[big]
    ctx.claim(CLAIM.format(left_default=left_default, sleeps=sleeps, ms_default=ms_default, big=big,
                           first_big=first_big, total=grad_mib, left_big=left_big, ms_big=ms_big),
              rows[0][2] <= 1.01 and first_big >= grad_mib - 1.01 and left_default == sleeps and left_big == 0,
              timing_holds=ms_default < 0.5 * ms_big)


if __name__ == "__main__":
    main_for(run, TITLE)
