"""What the flight recorder costs per collective.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/flight_recorder_overhead.py

A world of one (no network), a 4-byte tensor: what is left is per-call Python
overhead, the only thing the recorder adds. Printed: the recorder's own work
timed directly (issue + completion, sync and with an async handle's future
callback), and whole calls minidist vs torch.distributed, with the recorder on
and off. Variants alternate; medians of 7 rounds.
"""

import statistics
import time

import torch
import torch.distributed as dist

from minidist import comm, runtime
from minidist.comm import flight_recorder as fr


def per_call_us(fn, calls: int = 3000) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    with runtime.distributed("gloo"):
        x = torch.zeros(1)
        work = dist.all_reduce(x, async_op=True)
        work.wait()

        def record_sync():
            fr.issued(fr.issue("all_reduce", x, 1, None), None)

        def record_async():  # the future is already complete: the callback runs inline, as its cost
            fr.issued(fr.issue("all_reduce", x, 1, None), work)

        def comm_async():
            comm.all_reduce(x, async_op=True).wait()

        def torch_async():
            dist.all_reduce(x, async_op=True).wait()

        variants = {
            "recorder alone, sync entry": record_sync,
            "recorder alone, async entry (future callback)": record_async,
            "torch.distributed.all_reduce": lambda: dist.all_reduce(x),
            "minidist.comm.all_reduce, recorder on": lambda: comm.all_reduce(x),
            "minidist.comm.all_reduce, recorder off": None,
            "torch.distributed.all_reduce async+wait": torch_async,
            "minidist.comm.all_reduce async+wait, recorder on": comm_async,
        }
        samples = {name: [] for name in variants}
        for _ in range(7):
            for name, fn in variants.items():
                if fn is None:
                    fr.set_enabled(False)
                    samples[name].append(per_call_us(lambda: comm.all_reduce(x)))
                    fr.set_enabled(True)
                else:
                    samples[name].append(per_call_us(fn))
        for name, s in samples.items():
            print(f"{name:52} {statistics.median(s):8.2f} us/call  (min {min(s):.2f})")


if __name__ == "__main__":
    main()
    runtime.exit_process(0)  # skip a teardown that can abort (see runtime.exit_process)
