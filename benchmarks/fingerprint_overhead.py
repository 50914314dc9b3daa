"""What the collective-fingerprint check (MINIDIST_DEBUG_COLLECTIVES=1) costs per collective.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/fingerprint_overhead.py

all_reduce of 1 KB and 1 MB through minidist.comm, with the check off and on,
alternating in rounds; medians per call, printed by rank 0. The check adds one
blocking all_gather of one int64 on the same group, so its cost is about one
latency alpha, whatever the payload.
"""

import statistics
import time

import torch
import torch.distributed as dist

from minidist import comm, runtime


def per_call_us(x: torch.Tensor, calls: int) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        comm.all_reduce(x)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    with runtime.distributed("gloo") as topo:
        sizes = {"1 KB": (torch.ones(256), 400), "1 MB": (torch.ones(256 * 1024), 40)}
        samples = {(name, on): [] for name in sizes for on in (False, True)}
        for _ in range(9):
            for name, (x, calls) in sizes.items():
                for on in (False, True):
                    comm.set_debug(on)
                    samples[name, on].append(per_call_us(x, calls))
        comm.set_debug(False)
        if topo.is_main:
            for name in sizes:
                off, on = statistics.median(samples[name, False]), statistics.median(samples[name, True])
                low_off, low_on = min(samples[name, False]), min(samples[name, True])
                print(f"all_reduce {name}: median {off:8.1f} us off, {on:8.1f} us on: +{on - off:7.1f} us per collective "
                      f"(x{on / off:.2f}); min {low_off:8.1f} / {low_on:8.1f}: +{low_on - low_off:7.1f} us")
    runtime.exit_process(0)


if __name__ == "__main__":
    main()
