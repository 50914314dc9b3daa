"""What minidist.comm costs over torch.distributed when no trace is active, and when one is.

    .venv/bin/python benchmarks/trace_overhead.py

A world of one (no network), tiny tensors: the numbers are per-call Python
overhead, the only thing tracing can add. Runs alternate between variants.
"""

import statistics
import time

import torch
import torch.distributed as dist

from minidist import comm, runtime


def per_call_us(fn, calls: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    with runtime.distributed("gloo"):
        x = torch.zeros(1)
        variants = {
            "torch.distributed.all_reduce": lambda: dist.all_reduce(x),
            "minidist.comm.all_reduce": lambda: comm.all_reduce(x),
            "torch.distributed.all_reduce, async": lambda: dist.all_reduce(x, async_op=True).wait(),
            "minidist.comm.all_reduce, async": lambda: comm.all_reduce(x, async_op=True).wait(),
        }
        samples = {f"{name}{suffix}": [] for name in variants for suffix in ("", ", traced")
                   if name.startswith("minidist") or not suffix}
        for _ in range(7):
            for name, fn in variants.items():
                samples[name].append(per_call_us(fn))
                if name.startswith("minidist"):
                    with comm.trace():
                        samples[f"{name}, traced"].append(per_call_us(fn))
        for name, s in samples.items():
            base = statistics.median(samples["torch.distributed.all_reduce" + (", async" if "async" in name else "")])
            med = statistics.median(s)
            print(f"{name:48} {med:8.2f} us/call   {med - base:+7.2f} us vs torch")


if __name__ == "__main__":
    main()
