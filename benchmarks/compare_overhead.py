"""What recipes.compare's instrumentation costs a step: trace + wait timestamps + phase timestamps.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/compare_overhead.py

The comparison's default model under ddp and full_shard (the strategy with the most collectives),
steps alternating between plain and instrumented (minidist.comm.trace(), Work/Future waits
recorded, phases timed), each after a barrier, so machine load hits both alike. Prints the median step time of
each and their ratio, and a bottom-up figure that load cannot blur: the instrumentation's own
Python work per step (per-call cost of a traced collective and a recorded wait, measured in a
world of one, times this step's calls), as a share of the step.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAIRS = 16


def _one(bench, rec, instrumented: bool, i: int) -> float:
    """One step, plain or instrumented, after a barrier (so both ranks start together)."""
    from minidist import comm
    from minidist.compare.measure import no_phase

    batch = bench.batch()
    dist.barrier()
    t0 = time.perf_counter()
    if instrumented:
        with comm.trace(), rec.recording_waits():
            bench.step(batch, lambda p: rec.phase(p, i))
    else:
        bench.step(batch, no_phase)
    return time.perf_counter() - t0


def per_call_cost_us() -> float:
    """Python cost of one traced, async, waited collective over an untraced one (tiny tensor, own group)."""
    from minidist import comm
    from minidist.compare.recorder import StepRecorder

    group = dist.new_group([dist.get_rank()])  # a world of one inside the job: no network
    x, rec = torch.zeros(1), StepRecorder(time.perf_counter())

    def loop(n=2000):
        t0 = time.perf_counter()
        for _ in range(n):
            comm.all_reduce(x, group=group, async_op=True).wait()
        return (time.perf_counter() - t0) / n * 1e6

    plain, traced = [], []
    for _ in range(5):
        plain.append(loop())
        with comm.trace(), rec.recording_waits():
            traced.append(loop())
    return statistics.median(traced) - statistics.median(plain)


def main() -> None:
    from minidist import comm, runtime
    from minidist.compare.measure import Bench, no_phase
    from minidist.compare.recorder import StepRecorder
    from minidist.train.data import build_datasets
    from recipes.compare import compose

    with runtime.distributed("gloo") as topo:
        cfg = compose(["data=synthetic", "data.train_samples=512"])
        train_ds = build_datasets(cfg, topo)[0]
        extra_us = per_call_cost_us()
        for name in ("ddp", "full_shard"):
            bench = Bench(cfg, cfg.strategy_options[name], topo, train_ds)
            rec = StepRecorder(time.perf_counter())
            for i in range(2):
                _one(bench, rec, bool(i), i)
            plain, traced = [], []
            for i in range(PAIRS):  # alternate step by step; which goes first alternates too
                first = i % 2 == 0
                a = _one(bench, rec, not first, i)
                b = _one(bench, rec, first, i)
                plain.append(b if first else a)
                traced.append(a if first else b)
            with comm.trace() as tr:
                bench.step(bench.batch(), no_phase)
            calls = len(tr.records)
            p, t = statistics.median(plain), statistics.median(traced)
            ratio = statistics.median(x / y for x, y in zip(traced, plain))
            if topo.rank == 0:
                print(f"{name:<11} plain {p * 1e3:7.1f} ms  instrumented {t * 1e3:7.1f} ms  median pair ratio "
                      f"{ratio:.3f}  | bottom-up: {calls} collectives x {extra_us:.1f} us = {calls * extra_us / 1e3:.2f} "
                      f"ms = {100 * calls * extra_us * 1e-6 / p:.2f}% of a step", flush=True)
            del bench


if __name__ == "__main__":
    main()
