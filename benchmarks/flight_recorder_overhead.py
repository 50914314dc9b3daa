"""What the flight recorder costs per collective.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/flight_recorder_overhead.py

A world of one (no network), a 4-byte tensor: what is left is per-call Python
overhead, the only thing the recorder adds. minidist.comm.all_reduce runs with
the recorder, and with the recorder swapped out of collectives._issue for a
stub (what the call cost before it existed), blocking and async + wait;
torch.distributed.all_reduce beside them. Variants alternate; 9 rounds; the
median and the minimum (the least disturbed by other load) are printed.
"""

import statistics
import time

import torch
import torch.distributed as dist

from minidist import comm, runtime
from minidist.comm import collectives, flight_recorder


class NoRecorder:
    """Stands in for flight_recorder inside _issue: records nothing."""

    @staticmethod
    def issue(op, tensor, numel, group):
        return None

    @staticmethod
    def issued(entry, work):
        return work


def per_call_us(fn, calls: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    with runtime.distributed("gloo"):
        x = torch.zeros(1)
        calls = {
            "blocking": (lambda: dist.all_reduce(x), lambda: comm.all_reduce(x)),
            "async + wait": (lambda: dist.all_reduce(x, async_op=True).wait(),
                             lambda: comm.all_reduce(x, async_op=True).wait()),
        }
        samples = {(kind, v): [] for kind in calls for v in ("torch", "no recorder", "recorder")}
        for _ in range(9):
            for kind, (torch_call, comm_call) in calls.items():
                samples[kind, "torch"].append(per_call_us(torch_call))
                collectives._flight = NoRecorder
                samples[kind, "no recorder"].append(per_call_us(comm_call))
                collectives._flight = flight_recorder
                samples[kind, "recorder"].append(per_call_us(comm_call))
        for kind in calls:
            med = {v: statistics.median(samples[kind, v]) for v in ("torch", "no recorder", "recorder")}
            low = {v: min(samples[kind, v]) for v in med}
            print(f"{kind:13} us/call, median (min): torch {med['torch']:.1f} ({low['torch']:.1f}), "
                  f"minidist without recorder {med['no recorder']:.1f} ({low['no recorder']:.1f}), "
                  f"with {med['recorder']:.1f} ({low['recorder']:.1f}): recorder "
                  f"+{med['recorder'] - med['no recorder']:.1f} us (+{low['recorder'] - low['no recorder']:.1f})")


if __name__ == "__main__":
    main()
    runtime.exit_process(0)  # skip a teardown that can abort (see runtime.exit_process)
