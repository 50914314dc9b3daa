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
busy after the first layer's backward instead of after a quarter of the model.
The model's backward sleeps (emulated accelerator compute), so the overlap is
real on two CPU cores; "first launch" is when the first all_reduce was issued,
in ms after backward started (minidist.comm.trace records issue times).
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from minidist import DDP, comm
from recipes.lessons.common import Context, SleepLinear, interleaved_times, main_for, max_over_ranks

TITLE = "DDP bucket size sweep: buckets, first launch, step time"


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


def first_launch_ms(model, opt, x, repeats: int) -> float:
    """Least ms from the start of backward to the issue of the first all_reduce (best case: load on a
    shared machine only ever delays it)."""
    samples = []
    for _ in range(repeats):
        loss = model(x).square().mean()
        with comm.trace() as t:
            t0 = time.perf_counter()
            loss.backward()
        samples.append(min(r.issued_s for r in t.records if r.op == "all_reduce") - t0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return max_over_ranks(min(samples)) * 1e3


def run(ctx: Context) -> None:
    width, layers, seconds = (512, 4, 0.004) if ctx.small else (512, 8, 0.004)   # 1 MiB per weight
    caps = [None, 64.0] if ctx.small else [None, 1.0, 3.0, 64.0]
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(ctx.rank))
    grad_mib = layers * (width + 1) * width * 4 / 2**20
    models = {cap: build(width, layers, seconds, cap) for cap in caps}
    for model, opt in models.values():      # the first backward records the ready order; buckets rebuilt after
        step(model, opt, x)
    times = interleaved_times({cap: (lambda m=m: step(*m, x)) for cap, m in models.items()},
                              repeats=3 if ctx.small else 6, stat=min)
    rows, launch = [], {}
    for cap, (model, opt) in models.items():
        sizes = [sum(b.numels) * b.params[0].element_size() / 2**20 for b in model.reducer.buckets]
        launch[cap] = first_launch_ms(model, opt, x, 2 if ctx.small else 3)
        rows.append(["default (None)" if cap is None else cap, len(sizes), sizes[0], max(sizes),
                     launch[cap], times[cap] * 1e3])
    ctx.say(f"{layers} x Linear({width}, {width}): {grad_mib:.1f} MiB of gradients, N = {ctx.world}; backward "
            f"sleeps {2 * seconds * 1e3:.0f} ms per layer ({2 * seconds * layers * 1e3:.0f} ms in all)")
    ctx.table(["bucket_cap_mb", "buckets", "first MiB", "largest MiB", "first launch ms", "best step ms"], rows)
    big = caps[-1]
    first_big = rows[-1][2]  # MiB in the first bucket at the big cap: all but minidist's small last bucket
    ctx.claim(f"with the default 1 MiB first bucket the first all_reduce starts {launch[None]:.0f} ms into backward; "
              f"with a {big:g} MB cap the first bucket holds {first_big:.1f} of {grad_mib:.1f} MiB and waits "
              f"{launch[big]:.0f} ms, until backward is nearly over",
              rows[0][2] <= 1.01 and first_big >= grad_mib - 1.01, timing_holds=launch[None] < 0.5 * launch[big])


if __name__ == "__main__":
    main_for(run, TITLE)
