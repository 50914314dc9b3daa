"""FSDP prefetch trades memory for time: the next unit's all_gather runs while this one computes.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.prefetch

Without prefetch, each unit's all_gather is issued when the unit is about to run
and the compute waits for it: every gather is exposed (FSDP2's explicit prefetch lists, all
empty: minidist.fsdp.prefetch_ahead(units, 0, 0)). By default, as FSDP2, each unit
issues the all_gather of the unit that runs next (next in forward order; the reverse in
backward) as soon as it starts, so the gather hides behind the current unit's compute, if
that compute lasts at least as long as the gather. The price is memory: one more unit's
`full` alive while a unit computes, from its gather's start (the prefetch lists bound how
many). How much of it reaches the peak depends on what else is alive then: in backward, a
unit's reduce_scatter input lives until the collective has landed, so when a gather starts
against when a reduction lands moves the peak by up to a unit.

The layers' forward and backward sleep (emulated accelerator compute): on two
CPU cores, real matmuls would compete with gloo's threads for the cores.

What is checked, and how. That prefetch issues each gather in time to hide is an
order, read from torch's profiler, not from the engine: the c10d all_gather events against
the start of each unit's emulated compute (the _Sleep autograd function's events), on the
profiler's one clock, which no load can change. The same events count the units gathered
at once: when unit k starts computing, units 0..k-1 have freed theirs, so the gathers issued
so far less k are the units holding full parameters (1 without prefetch, 2 with). The peak
bytes are torch's MemTracker's. That the forward is then faster is the clock's part.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from torch.profiler import ProfilerActivity, profile

from minidist import FSDP
from minidist.fsdp import prefetch_ahead
from recipes.lessons.common import Context, SleepLinear, main_for, max_over_ranks, peak_bytes

TITLE = "FSDP prefetch on/off: step time and peak memory (emulated compute)"

CLAIM = ("prefetch issues {ahead_on} of the {hideable} forward all_gathers that can hide before the unit ahead of "
         "them starts computing (without: {ahead_off}; torch's profiler), for {more_units} more unit gathered at once "
         "(peaks {extra:+.1f} MiB per rank apart, at most two units, 2 x {unit:.1f} MiB: the extra unit's parameters, "
         "and a reduce_scatter input that has not landed yet when they are allocated), "
         "and makes the forward {fwd:.2f}x faster (> 1.05; backward {bwd:.2f}x)")


def build(width: int, layers: int, seconds: float, prefetch: bool):
    torch.manual_seed(0)
    net = torch.nn.Sequential(*(SleepLinear(width, seconds) for _ in range(layers)))
    model = FSDP(net, wrap={SleepLinear})  # FSDP2's default: each unit prefetches the next one
    if not prefetch:
        prefetch_ahead(model.units, forward=0, backward=0)  # explicit prefetch lists, all empty
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def step(model, opt, x) -> tuple[float, float]:
    """One training step; returns (forward seconds, backward + optimizer seconds)."""
    t0 = time.perf_counter()
    loss = model(x).sum()
    t1 = time.perf_counter()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return t1 - t0, time.perf_counter() - t1


def forward_events(model, opt, x) -> tuple[int, int, int]:
    """From torch's profiler, one forward: (all_gathers issued before the unit ahead of them started computing,
    of how many can be: every one but the first unit's; the most units holding full parameters at once)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto's own log lines, on a CUDA build without a GPU
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    events = sorted((e.time_range.start, e.name) for e in prof.events())
    issued = [t for t, name in events if name.startswith("c10d::_allgather") or name.startswith("c10d::allgather")]
    computing = [t for t, name in events if name == "_Sleep"]                  # unit k's compute is the k-th
    ahead = sum(issued[k] < computing[k - 1] for k in range(1, len(issued)))
    at_once = max(sum(t < start for t in issued) - k for k, start in enumerate(computing))
    return int(-max_over_ranks(-ahead)), len(issued) - 1, int(max_over_ranks(at_once))


def best_times(engines: dict, x, repeats: int) -> dict:
    """Fastest forward and fastest backward of each engine over interleaved steps (max over ranks)."""
    best = {p: [float("inf"), float("inf")] for p in engines}
    for rep in range(repeats):
        for p in (list(engines) if rep % 2 == 0 else list(engines)[::-1]):
            dist.barrier()
            f, b = step(*engines[p], x)
            best[p] = [min(best[p][0], f), min(best[p][1], b)]
    return {p: [max_over_ranks(v) for v in fb] for p, fb in best.items()}


def run(ctx: Context) -> None:
    width, layers, seconds = (1024, 3, 0.006) if ctx.small else (1024, 6, 0.008)
    x = torch.randn(4, width)
    engines = {p: build(width, layers, seconds, p) for p in (True, False)}
    for m in engines.values():     # the first step records the unit order that prefetch follows
        step(*m, x)
    times = best_times(engines, x, repeats=5 if ctx.small else 10)
    unit_mib = (width + 1) * width * 4 / 2**20
    rows, ahead = [], {}
    for p, (model, opt) in engines.items():
        peak = max_over_ranks(peak_bytes(lambda: step(model, opt, x), model, opt)) / 2**20
        ahead[p], hideable, at_once = forward_events(model, opt, x)
        rows.append(["on" if p else "off", ahead[p], times[p][0] * 1e3, times[p][1] * 1e3, at_once, peak])
    ctx.say(f"{layers} units of Linear({width}, {width}) ({unit_mib:.1f} MiB each), full_shard, N = {ctx.world}; "
            f"each sleeps {seconds * 1e3:.0f} ms in forward ({seconds * layers * 1e3:.0f} ms in all) and "
            f"{2 * seconds * 1e3:.0f} ms in backward; best of interleaved steps; gathers ahead: forward all_gathers "
            f"issued before the unit ahead of them started computing (of {hideable}); units gathered at once: all_gathers "
            f"issued before a unit's compute, less the units done (both from torch's profiler)")
    ctx.table(["prefetch", "gathers ahead", "forward ms", "backward+step ms", "units gathered at once",
               "peak MiB/rank"], rows)
    fwd = times[False][0] / times[True][0]
    bwd = times[False][1] / times[True][1]
    extra = rows[0][5] - rows[1][5]
    more = rows[0][4] - rows[1][4]
    ctx.claim(CLAIM.format(ahead_on=ahead[True], hideable=hideable, ahead_off=ahead[False], more_units=more,
                           extra=extra, unit=unit_mib, fwd=fwd, bwd=bwd),
              ahead[True] == hideable and ahead[False] == 0 and more > 0 and extra <= 2 * unit_mib + 0.1,
              timing_holds=fwd > 1.05)


if __name__ == "__main__":
    main_for(run, TITLE)
