"""A pipeline's bubble: p - 1 of every m + p - 1 slots idle, whatever the schedule's order; interleaving divides it.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.pp_bubble     (and --nproc_per_node=4)

The model's layers split over the N ranks (minidist.pp), every layer's forward sleeping
and its backward sleeping twice as long (emulated accelerator compute, benchmarks/emulated.py:
time passes, no core is used), so a rank's work per step is known: m (t_F + t_B) for m
micro-batches. The step is measured (the slowest rank's wall time, best of the repeats), and
the bubble is the share of it a rank was not computing: 1 - m (t_F + t_B) / step.

    1F1B, GPipe     (p-1) / (m+p-1)       the last micro-batch enters the last stage p-1 forwards
                                          late and its gradient leaves the first p-1 backwards late
    interleaved     (p-1) / (v m+p-1)     v stages per rank, each 1/v of the layers: the fill and
                                          the drain take 1/v of the time

The simulated bubble of each schedule's own action list (minidist.pp.check.simulate, compute
in units of a forward, messages free) is the formula exactly: that part of the claim is decided
by the code. What the clock adds on top is the runtime's cost per send and receive (about a
millisecond per operation on two shared cores: benchmarks/pp_vs_torch.py measures
torch.distributed.pipelining's the same way), a share that shrinks as the compute grows.
"""

from __future__ import annotations

import time

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from minidist import pp
from minidist.pp.check import bubble
from recipes.lessons.common import Context, main_for, max_over_ranks
from recipes.pp_timeline import sleeping_pipeline

TITLE = "the bubble of a pipeline falls as (p-1)/(m+p-1), and by v with interleaving"

CLAIM = ("1F1B's bubble falls from {b1:.2f} at m = 1 to {bm:.2f} at m = {m} micro-batches (formula (p-1)/(m+p-1): "
         "{f1:.2f}, {fm:.2f}); interleaving v = 2 stages per rank cuts it to {bi:.2f} (formula (p-1)/(v m+p-1): "
         "{fi:.2f}); each schedule's simulated list gives the formula exactly (N = {n})")


def measured(name: str, m: int, v: int, forward_s: float, repeats: int, mesh) -> float:
    """1 - busy / step for `name` at m micro-batches, two sleeping layers per rank."""
    _, step = sleeping_pipeline(name, m, v, forward_s, mesh)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        best = min(best, max_over_ranks(time.perf_counter() - t0))
    return 1 - 3 * m * forward_s / best


def run(ctx: Context) -> None:
    p, m = ctx.world, 2 * ctx.world
    forward_s, repeats = (0.006, 2) if ctx.small else (0.04, 3)
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
    rows, sims = [], []
    for name, v, mb in (("1f1b", 1, 1), ("gpipe", 1, m), ("1f1b", 1, m), ("interleaved_1f1b", 2, m)):
        got = measured(name, mb, v, forward_s, repeats, mesh)
        formula = pp.cost.bubble(name, p, mb, v)
        sims.append(abs(bubble(pp.check(pp.build(name, p, mb, v))) - formula) < 1e-9)
        rows.append([name, v, mb, formula, got, got - formula])
    ctx.say(f"p = {p} ranks, forward {forward_s * 1e3:g} ms and backward {2 * forward_s * 1e3:g} ms per micro-batch "
            f"per rank (sleeps); bubble = 1 - busy / step (best of {repeats})")
    ctx.table(["schedule", "v", "m", "formula", "measured", "above"], rows)
    (_, _, _, f1, b1, _), _, (_, _, _, fm, bm, _), (_, _, _, fi, bi, _) = rows
    slack = 0.08 if ctx.small else 0.04  # the runtime's cost per operation, a larger share of short steps
    timing = all(-0.02 < r[5] < slack for r in rows) and b1 > bm > bi
    ctx.claim(CLAIM.format(b1=b1, bm=bm, m=m, f1=f1, fm=fm, bi=bi, fi=fi, n=p), all(sims), timing)


if __name__ == "__main__":
    main_for(run, TITLE)
