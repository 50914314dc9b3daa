"""gloo's own reduce_scatter against minidist's point-to-point ring (minidist.comm.ring).

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=4 benchmarks/reduce_scatter.py

For each group size N in --worlds (the first N ranks; the others sit it out) and each payload
S (the full fp32 input: 1, 4, 16 MB), alternating rounds of `native` and `ring` calls in one
invocation so that machine load hits both alike; all_reduce of the same S alongside, since
gloo's reduce_scatter is an all_reduce inside (expect native ~ all_reduce, ring ~ half).
Prints the median per-call time (slowest rank) and the ring/native ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from minidist import comm


def per_call_s(fn, calls: int, group) -> float:
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = torch.tensor((time.perf_counter() - t0) / calls)
    dist.all_reduce(elapsed, dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def bench(n: int, mb: float, rounds: int, calls: int, group) -> dict[str, float]:
    numel = int(mb * 2**20) // 4 // n * n
    x, out = torch.randn(numel), torch.empty(numel // n)
    variants = {
        "native": lambda: comm.reduce_scatter(out, x, group=group, algorithm="native"),
        "ring": lambda: comm.reduce_scatter(out, x, group=group, algorithm="ring"),
        "all_reduce": lambda: comm.all_reduce(x, group=group),
    }
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            times[v].append(per_call_s(variants[v], calls, group))
    return {v: statistics.median(t) for v, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4", help="group sizes, each <= the torchrun world")
    ap.add_argument("--mb", default="1,4,16", help="payloads S in MB (the full reduce_scatter input)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if rank == 0:
            print(f"{'N':>3}{'S MB':>6}{'native ms':>11}{'ring ms':>9}{'all_reduce ms':>15}{'ring/native':>13}")
        for n in (int(w) for w in args.worlds.split(",") if int(w) <= world):
            group = dist.new_group(list(range(n))) if n < world else None
            if rank < n:
                for mb in (float(m) for m in args.mb.split(",")):
                    t = bench(n, mb, args.rounds, args.calls, group)
                    if rank == 0:
                        print(f"{n:>3}{mb:>6g}{t['native'] * 1e3:>11.2f}{t['ring'] * 1e3:>9.2f}"
                              f"{t['all_reduce'] * 1e3:>15.2f}{t['ring'] / t['native']:>13.2f}", flush=True)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
