"""ZeRO-1 as the paper wrote it sends DDP's bytes; the owner-broadcast variant sends 1.5x.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.zero1_vs_ddp     (and --nproc_per_node=4)

An all_reduce is a reduce_scatter followed by an all_gather. The paper's ZeRO-1
(minidist.ShardedOptimizer, the default) runs the optimizer in between: each rank
receives only the averaged gradient of its equal slice of every bucket (reduce_scatter,
S (N-1)/N bytes), updates that slice, and one all_gather per bucket returns every
slice to every rank (S (N-1)/N): DDP's 2 S (N-1)/N, with 1/N of the optimizer state.

The owner-broadcast variant (ShardedOptimizer(owner_broadcast=True): torch's
ZeroRedundancyOptimizer, CS336's exercise) keeps DDP's whole all_reduce, lets each
rank update the whole parameters it owns, and then every owner broadcasts them: S (N-1)/N
more bytes per rank on average (1.5x DDP), N collectives of latency instead of one per
bucket, a staging copy of the other shares, and owners of whole parameters are only as
balanced as the parameter sizes allow (here one layer is 4x the others): each parameter goes to
the least-loaded rank so far, so the largest share is at most 1/N of the state plus the largest
parameter's (at N = 4 here 0.40 of AdamW's state where the paper's partitions keep 0.25).

Bytes are what the kernel counted this process writing (minidist.comm.kernel_io: gloo's
sockets), per step; collectives per step from the trace; peak memory from torch's MemTracker.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import DDP, ShardedOptimizer, comm
from minidist.comm import kernel_io
from recipes.lessons.common import MiB, Context, interleaved_times, main_for, peak_bytes

TITLE = "ZeRO-1 as in the paper moves DDP's bytes; the owner-broadcast variant 1.5x"

ENGINES = ("DDP", "ZeRO-1 (paper)", "ZeRO-1 owner-broadcast")


def build(width: int, engine: str):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(width, 4 * width), nn.Tanh(), nn.Linear(4 * width, width), nn.Tanh(),
                        nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
    if engine == "DDP":
        model = DDP(net)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    return net, ShardedOptimizer(net.parameters(), torch.optim.AdamW, lr=1e-3,
                                 owner_broadcast=engine.endswith("owner-broadcast"))


def step(model, opt, x) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def state_bytes(opt) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v) and v.dim() > 0)


def _mean_over_ranks(value: float) -> float:
    t = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def _max_over_ranks(value: float) -> float:
    t = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return float(t)


def run(ctx: Context) -> None:
    width = 256 if ctx.small else 512
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(ctx.rank))
    engines = {e: build(width, e) for e in ENGINES}
    psi = sum(p.numel() for p in engines["DDP"][0].parameters())
    rows, sent = [], {}
    for name, (model, opt) in engines.items():
        for _ in range(2):  # AdamW's state exists; DDP rebuilds its buckets in the second forward
            step(model, opt, x)
        with comm.trace() as t, kernel_io.written() as w:
            step(model, opt, x)
        calls = {}
        for r in t.records:
            calls[r.op] = calls.get(r.op, 0) + 1
        sent[name] = (_mean_over_ranks(w.bytes), _max_over_ranks(w.bytes))
        peak = _max_over_ranks(peak_bytes(lambda: step(model, opt, x), model, opt))
        rows.append([name, sent[name][0] / MiB, sent[name][1] / MiB, ", ".join(f"{n} {op}" for op, n in calls.items()),
                     _max_over_ranks(state_bytes(opt)) / MiB, peak / MiB])
    times = interleaved_times({n: (lambda m=m, o=o: step(m, o, x)) for n, (m, o) in engines.items()},
                              repeats=3 if ctx.small else 8, stat=min)
    for row in rows:
        row.append(times[row[0]] * 1e3)
    ctx.say(f"MLP {width} -> {4 * width} -> {width} -> {width} -> {width}, psi = {psi / 1e6:.2f}M "
            f"(S = {4 * psi / MiB:.1f} MiB), AdamW, N = {ctx.world}; 2 S (N-1)/N = "
            f"{2 * 4 * psi * (ctx.world - 1) / ctx.world / MiB:.2f} MiB")
    ctx.table(["engine", "sent MiB/step (mean)", "(busiest rank)", "collectives per step",
               "AdamW state MiB (largest)", "peak MiB", "step ms (best)"], rows)
    ddp, paper, owner = (sent[e][0] for e in ENGINES)
    full = state_bytes(engines["DDP"][1])                         # every rank: AdamW's whole state, 8 psi
    largest = {e: _max_over_ranks(state_bytes(engines[e][1])) / full for e in ENGINES[1:]}
    summed = {e: _mean_over_ranks(state_bytes(engines[e][1])) * ctx.world / full for e in ENGINES[1:]}
    bound = 1 / ctx.world + max(p.numel() for p in engines["DDP"][0].parameters()) / psi
    ctx.claim(f"the paper's ZeRO-1 sends {paper / ddp:.3f}x DDP's bytes per step and the owner-broadcast "
              f"variant {owner / ddp:.2f}x (mean over the {ctx.world} ranks; its busiest rank "
              f"{sent[ENGINES[2]][1] / ddp:.2f}x); the largest rank keeps {largest[ENGINES[1]]:.3f} of AdamW's state "
              f"under the paper's equal partitions (1/N = {1 / ctx.world:.3f}) and {largest[ENGINES[2]]:.3f} under the "
              f"variant's whole parameters (at most 1/N + the largest parameter's share, {bound:.3f})",
              abs(paper / ddp - 1) <= 0.02 and 1.45 <= owner / ddp <= 1.55
              and abs(largest[ENGINES[1]] - 1 / ctx.world) <= 0.01 and largest[ENGINES[2]] <= bound
              and all(abs(v - 1) <= 0.01 for v in summed.values()))

if __name__ == "__main__":
    main_for(run, TITLE)
