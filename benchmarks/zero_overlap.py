"""ZeRO's parameter all_gather overlapped with the next forward, or waited for inside step().

    OMP_NUM_THREADS=1 flock /work/bench.lock .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/zero_overlap.py

Layers whose forward and backward sleep emulate accelerator compute (on 2 CPU cores real compute
would compete with gloo's threads for the same cores, and nothing could hide). Each round runs a
few steps of ShardedOptimizer(overlap_param_gather=False) and of overlap_param_gather=True,
alternating, and prints the median step time (max over ranks) of each and their ratio; the second
number is what the step pays for the all_gather when it is waited for before step() returns.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist.zero import ShardedOptimizer
from emulated import sleep  # benchmarks/emulated.py: the script's own directory


class SleepLayer(nn.Module):
    def __init__(self, width: int, seconds: float):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.seconds = seconds

    def forward(self, x):
        return sleep(self.linear(x), self.seconds)


def build(width: int, depth: int, seconds: float, stage: int, overlap: bool):
    torch.manual_seed(0)
    model = nn.Sequential(*[SleepLayer(width, seconds) for _ in range(depth)])
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4, stage=stage, bucket_cap_mb=4.5,
                           module=model, overlap_param_gather=overlap)
    return model, opt


def step(model, opt, x) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def timed(model, opt, x, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        step(model, opt, x)
        out.append(time.perf_counter() - t0)
    opt.wait_for_params()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--sleep-ms", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--stage", type=int, default=1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.randn(8, args.width)
    engines = {o: build(args.width, args.depth, args.sleep_ms / 1e3, args.stage, o) for o in (False, True)}
    for model, opt in engines.values():
        step(model, opt, x)
        opt.wait_for_params()
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for overlap, (model, opt) in engines.items():
            local = timed(model, opt, x, args.steps)
            t = torch.tensor(local)
            dist.all_reduce(t, dist.ReduceOp.MAX)
            times[overlap] += t.tolist()
    if rank == 0:
        psi = sum(p.numel() for p in engines[True][0].parameters())
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"ZeRO-{args.stage}, world {world}, {psi / 1e6:.1f}M parameters ({4 * psi / 2**20:.0f} MiB), "
              f"{args.depth} layers sleeping {args.sleep_ms:g} ms forward / {2 * args.sleep_ms:g} ms backward; "
              f"median step over {len(times[False])} steps (max over ranks), alternating")
        print(f"  overlap_param_gather=False: {off * 1e3:.1f} ms")
        print(f"  overlap_param_gather=True:  {on * 1e3:.1f} ms   ({off / on:.2f}x faster)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
