"""DDP's exposed communication against the bucket size: measured, and predicted by the recurrence.

    torchrun --standalone --nproc_per_node=2 benchmarks/bucket_overhead.py

docs/ddp.md derives the communication left exposed after backward from the recurrence
e_i = max(r_i, e_(i-1)) + c_i, and from it the best bucket size. This benchmark checks both on
24 Linear(256, 256) layers (a quarter MiB of fp32 gradient each) whose backward sleeps (emulated
accelerator compute, recipes.lessons.common.SleepLinear), at two speeds of backward: a slow
one, where the link keeps up and only the last bucket is exposed, and a fast one, where the link
falls behind and the bucket count's latencies add up.

Measured, per bucket cap: overhead = median step time with synchronisation minus the median
under no_sync (the same steps without communication, alternating with them), the project's
definition (minidist.comm.trace's module docstring). Predicted: the recurrence run on the
buckets DDP really built (every gradient is under 1 MiB, so the CPU path reduces each bucket in
place with one coalesced all_reduce: one collective per bucket, no copies), with
alpha and beta calibrated on this group (minidist.comm.calibrate), the backward's length T
measured under no_sync, and gradients assumed to arrive at an even rate rho = S / T. Also
printed: the closed form's best bucket b* = sqrt(S a rho) and the condition u rho < 1 under
which the link keeps up (a = 2(N-1) alpha, u = 2(N-1)/N beta: docs/ddp.md's names).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import DDP, comm, runtime
from recipes.lessons.common import SleepLinear

WIDTH, LAYERS = 256, 24
CAPS_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 16.0)


def build(cap: float, seconds: float):
    torch.manual_seed(0)
    net = nn.Sequential(*(SleepLinear(WIDTH, seconds, backward_only=True) for _ in range(LAYERS)))
    model = DDP(net, bucket_cap_mb=cap)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def step(model, opt, x, sync: bool) -> tuple[float, float]:
    """(step seconds, backward seconds)."""
    dist.barrier()
    t0 = time.perf_counter()
    if sync:
        loss = model(x).square().mean()
    else:
        with model.no_sync():
            loss = model(x).square().mean()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=False)
    return time.perf_counter() - t0, t2 - t1


def predicted_exposed(sizes: list[int], total: int, T: float, a: float, u: float) -> float:
    """e_L - T from the recurrence, buckets of `sizes` bytes in launch order, gradients arriving evenly over T."""
    end, produced = 0.0, 0
    for s in sizes:
        produced += s
        ready = T * produced / total
        end = max(ready, end) + a + s * u
    return end - T


def run(seconds: float, x, model_cost, repeats: int) -> None:
    n = dist.get_world_size()
    a, u = 2 * (n - 1) * model_cost.alpha, 2 * (n - 1) / n * model_cost.beta
    rows = []
    for cap in CAPS_MB:
        model, opt = build(cap, seconds)
        for _ in range(2):  # the buckets are rebuilt in ready order after the first backward
            step(model, opt, x, True)
        sync, local, bwd = [], [], []
        for k in range(repeats):
            for mode in ((True, False) if k % 2 == 0 else (False, True)):
                t, b = step(model, opt, x, mode)
                (sync if mode else local).append(t)
                if not mode:
                    bwd.append(b)
        sizes = [sum(b.numels) * 4 for b in model.reducer.buckets]
        T = statistics.median(bwd)
        measured = torch.tensor([statistics.median(sync) - statistics.median(local), T], dtype=torch.float64)
        dist.all_reduce(measured, dist.ReduceOp.MAX)
        rows.append((cap, sizes, float(measured[0]), float(measured[1])))
    total = sum(rows[0][1])
    T = statistics.median(r[3] for r in rows)
    rho = total / T
    if dist.get_rank() == 0:
        regime = "the link keeps up" if u * rho < 1 else "the link falls behind"
        print(f"\nbackward sleeps {2e3 * seconds:.1f} ms per layer: T = {T * 1e3:.1f} ms, S = {total / 2**20:.1f} MiB, "
              f"rho = S/T = {rho / 1e9:.3f} GB/s, u rho = {u * rho:.2f} ({regime}); b* = sqrt(S a rho) = "
              f"{math.sqrt(total * a * rho) / 2**20:.2f} MiB")
        print(f"{'cap MB':>7}{'buckets':>9}{'largest MiB':>13}{'predicted ms':>14}{'measured ms':>13}")
        for cap, sizes, meas, t in rows:
            pred = predicted_exposed(sizes, total, t, a, u)
            print(f"{cap:>7g}{len(sizes):>9}{max(sizes) / 2**20:>13.2f}{pred * 1e3:>14.1f}{meas * 1e3:>13.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--sleep-ms", type=float, nargs="+", default=[4.0, 0.25], help="forward sleep per layer (backward: 2x)")
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args()
    try:
        with runtime.distributed("gloo", timeout_s=120) as topo:
            torch.set_num_threads(1)
            cost = comm.calibrate()
            if topo.rank == 0:
                print(f"N = {topo.world_size}, {LAYERS} x Linear({WIDTH}, {WIDTH}); calibrated alpha "
                      f"{cost.alpha * 1e6:.1f} us, beta {cost.beta * 1e9:.3f} ns/B; a = 2(N-1) alpha, "
                      f"u = 2(N-1)/N beta; exposed = step - the same step under no_sync (medians of "
                      f"{args.repeats}, alternating)")
            x = torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(topo.rank))
            for ms in args.sleep_ms:
                run(ms / 1e3, x, cost, args.repeats)
    except Exception as exc:  # noqa: BLE001 - one line per rank; MINIDIST_TRACEBACK=1 for the trace
        runtime.exit_on_error(exc)
    runtime.exit_process(0)


if __name__ == "__main__":
    main()
