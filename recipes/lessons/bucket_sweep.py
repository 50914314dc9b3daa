"""DDP's bucket size against the formula: the exposed communication at b* = sqrt(S a rho) and either side of it.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.bucket_sweep

Backward produces gradients last layer first; minidist.DDP packs them into buckets in that
order and all_reduces a bucket as soon as its last gradient arrives. docs/ddp.md (the maths)
models one step: k = S / b buckets of b bytes, gradients arriving evenly at rho = S / T bytes
per second over a backward of T seconds, each all_reduce costing a + b u (a = 2(N-1) alpha,
u = 2(N-1)/N beta). What is left exposed after backward is

    exposed(b) = max(a + b u,  b / rho + (S / b) a + S u - T)

and when the link falls behind (u rho >= 1) the second term, a wait for the first bucket to fill
plus S / b latencies plus all the bytes, is least at b* = sqrt(S a rho). The lesson makes the
link fall behind on purpose (the layers' backward sleeps, emulated accelerator compute, for
about 0.6 S u in all), calibrates alpha and beta on this group (minidist.comm.calibrate),
measures T, and runs DDP with a bucket per tensor, buckets of b* and one bucket for everything. Exposed is
measured as the fastest step less the fastest same step under no_sync (alternating steps; load
only ever adds time).

What the clock shows on 2 shared CPU cores: a bucket per tensor leaves more exposed than b*,
its S / b latencies adding up, as the formula says; but at b* far more is exposed than the
formula's few ms, and one bucket, which starts when backward ends, leaves 0.8-2.3x its a + S u
(in the runs so far). The recurrence behind the formula assumes buckets travel one after
another on a link of their own; here several buckets' all_reduces are in flight at once and
gloo sums them on the same two cores the other rank and the hooks need, so each bucket costs
much more than an isolated all_reduce's a (what alpha was calibrated on). On a GPU the reduction
runs on the device and NCCL runs a communicator's collectives in order, the recurrence's
assumptions; the lesson prints both so the difference shows.

What is checked, and how. The clock's part: a bucket per tensor exposes more than b* (tolerated
on a loaded machine in --small runs; the other times are printed beside the formula's). The
part no load can change is an order: with a bucket per tensor the first all_reduce is issued
while most sleeping layers' backwards are still to run; with one bucket, only when none is (the
comm.trace issue time against a log of the sleeps, on one clock).
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import DDP, comm
from recipes.lessons.common import Context, SleepLinear, compute_log, main_for, max_over_ranks

TITLE = "DDP's bucket size against the formula b* = sqrt(S a rho): exposed communication either side of it"

CLAIM = ("a bucket per tensor leaves {small:.1f} ms exposed against {at_best:.1f} ms at the formula's "
         "b* = sqrt(S a rho) = {best:.2f} MiB: more, as the formula says, S / b latencies adding up (formula "
         "{f_small:.1f} and {f_best:.1f} ms); one bucket leaves {one:.1f} ms, {ratio:.2f}x the formula's a + S u; "
         "the first all_reduce is issued with {left_small} of {sleeps} "
         "sleeping backwards still to run with a bucket per tensor, and with {left_one} left in one bucket")


def build(width: int, layers: int, seconds: float, cap_mb: float):
    torch.manual_seed(0)
    net = nn.Sequential(*(SleepLinear(width, seconds, backward_only=True) for _ in range(layers)))
    model = DDP(net, bucket_cap_mb=cap_mb)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def step(model, opt, x, sync: bool = True) -> float:
    """One step; returns the seconds backward took."""
    loss = model(x).square().mean() if sync else _no_sync_forward(model, x)
    t0 = time.perf_counter()
    loss.backward()
    t1 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=False)
    return t1 - t0


def _no_sync_forward(model, x):
    with model.no_sync():
        return model(x).square().mean()


def exposed(model, opt, x, repeats: int) -> tuple[float, float]:
    """(fastest step with sync less fastest step under no_sync: load only ever adds time, so the best of alternating
    steps is what it disturbs least; backward under no_sync, median), the slowest rank's."""
    sync, local, backward = [], [], []
    for k in range(repeats):
        for mode in ((True, False) if k % 2 == 0 else (False, True)):
            dist.barrier()
            t0 = time.perf_counter()
            bwd = step(model, opt, x, mode)
            (sync if mode else local).append(time.perf_counter() - t0)
            if not mode:
                backward.append(bwd)
    return max_over_ranks(min(sync) - min(local)), max_over_ranks(statistics.median(backward))


def first_launch(model, opt, x) -> tuple[int, int]:
    """(sleeping backwards not yet started when the first all_reduce was issued, fewest over the ranks; sleeps)."""
    loss = model(x).square().mean()
    with comm.trace() as t, compute_log() as log:
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    issued = min(r.issued_s for r in t.records if r.op == "all_reduce")
    return int(-max_over_ranks(-sum(s > issued for s in log.backward))), len(log.backward)


def formula(b: float, s: float, a: float, u: float, rho: float, t: float) -> float:
    """docs/ddp.md's exposed(b), in seconds, for buckets of b bytes (at most S)."""
    b = min(b, s)
    return max(a + b * u, b / rho + (s / b) * a + s * u - t)


def run(ctx: Context) -> None:
    width, layers, repeats = (512, 6, 2) if ctx.small else (512, 24, 25)   # 1 MiB per layer: minidist's last bucket is one
    n = ctx.world
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(ctx.rank))
    s = layers * (width + 1) * width * 4                    # bytes of gradients
    cost = comm.calibrate()
    a, u = 2 * (n - 1) * cost.alpha, 2 * (n - 1) / n * cost.beta
    seconds = max(0.3 * s * u / layers, 1e-5)               # backward sleeps 2 x seconds per layer: T ~ 0.6 S u
    probe = build(width, layers, seconds, 1.0)
    step(*probe, x)
    _, t = exposed(*probe, x, 2)
    rho = s / t
    best = math.sqrt(s * a * rho)
    caps = {"per tensor": 1024, "b*": best, "one bucket": 4 * s}   # 1 KiB: every weight and bias alone
    rows, measured, predicted, left = [], {}, {}, {}
    for name, cap in caps.items():
        model, opt = build(width, layers, seconds, cap / 2**20)
        for _ in range(2):                                  # buckets are rebuilt in ready order after the first
            step(model, opt, x)
        measured[name], _ = exposed(model, opt, x, repeats)
        b = s / len(model.reducer.buckets) if name == "per tensor" else cap   # the formula's even buckets
        predicted[name] = formula(b, s, a, u, rho, t)
        left[name], sleeps = first_launch(model, opt, x)
        rows.append([name, cap / 2**20, len(model.reducer.buckets), left[name], predicted[name] * 1e3,
                     measured[name] * 1e3])
    ctx.say(f"{layers} x Linear({width}, {width}): S = {s / 2**20:.1f} MiB of gradients, N = {n}; calibrated alpha "
            f"{cost.alpha * 1e6:.0f} us, beta {cost.beta * 1e9:.2f} ns/B (a = {a * 1e3:.2f} ms, S u = {s * u * 1e3:.1f} "
            f"ms); backward T = {t * 1e3:.1f} ms (sleeping {2e3 * seconds:.2f} ms per layer), rho = S/T, u rho = "
            f"{u * rho:.2f}; exposed = step - the same step under no_sync (best of {repeats}, alternating); "
            f"layers left: sleeping backwards not yet started when the first all_reduce was issued")
    ctx.table(["buckets of", "MiB", "buckets", "layers left", "formula ms", "measured ms"], rows)
    ratio = measured["one bucket"] / predicted["one bucket"]
    ctx.claim(CLAIM.format(one=measured["one bucket"] * 1e3, ratio=ratio, f_one=predicted["one bucket"] * 1e3,
                           small=measured["per tensor"] * 1e3, f_small=predicted["per tensor"] * 1e3, best=best / 2**20,
                           at_best=measured["b*"] * 1e3, f_best=predicted["b*"] * 1e3, left_small=left["per tensor"],
                           sleeps=sleeps, left_one=left["one bucket"]),
              left["per tensor"] > sleeps // 2 and left["one bucket"] == 0,
              timing_holds=measured["per tensor"] > measured["b*"])


if __name__ == "__main__":
    main_for(run, TITLE)
