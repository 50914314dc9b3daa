"""What recipes.compare's instrumentation costs a step: the trace (bytes, completion and wait times).

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/compare_overhead.py

The comparison's default model under ddp and full_shard (the strategy with the most collectives),
the trainer's step (minidist.compare.measure.Bench) alternating between plain and traced
(minidist.comm.trace(): records, completion callbacks, timed waits on works and futures; phase
edges come from the task's loss either way), each after a barrier, so machine load hits both
alike. Prints the median step time of each and their ratio, and a bottom-up figure that load
cannot blur: the trace's own Python work per step (per-call cost of a traced, async, waited
collective, measured in a world of one, times this step's calls), as a share of the step.
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


def _one(bench, instrumented: bool) -> float:
    """One step, plain or traced, after a barrier (so both ranks start together)."""
    from minidist import comm

    dist.barrier()
    if instrumented:
        with comm.trace():
            start, end = bench.step()
    else:
        start, end = bench.step()
    return end - start


def per_call_cost_us() -> float:
    """Python cost of one traced, async, waited collective over an untraced one (tiny tensor, own group)."""
    from minidist import comm

    group = dist.new_group([dist.get_rank()])  # a world of one inside the job: no network
    x = torch.zeros(1)

    def loop(n=2000):
        t0 = time.perf_counter()
        for _ in range(n):
            comm.all_reduce(x, group=group, async_op=True).wait()
        return (time.perf_counter() - t0) / n * 1e6

    plain, traced = [], []
    for _ in range(5):
        plain.append(loop())
        with comm.trace():
            traced.append(loop())
    return statistics.median(traced) - statistics.median(plain)


def main() -> None:
    from minidist import comm, runtime
    from minidist.compare.measure import Bench
    from minidist.train.data import build_datasets
    from recipes.compare import compose

    with runtime.distributed("gloo") as topo:
        cfg = compose(["data=synthetic", "data.train_samples=512", "strategies=[ddp,full_shard]"])
        train_ds = build_datasets(cfg, topo)[0]
        extra_us = per_call_cost_us()
        for name in ("ddp", "full_shard"):
            bench = Bench(cfg, cfg.strategy_options[name], topo, train_ds)
            for i in range(2):
                _one(bench, bool(i))
            plain, traced = [], []
            for i in range(PAIRS):  # alternate step by step; which goes first alternates too
                first = i % 2 == 0
                a = _one(bench, not first)
                b = _one(bench, first)
                plain.append(b if first else a)
                traced.append(a if first else b)
            with comm.trace() as tr:
                bench.step()
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
