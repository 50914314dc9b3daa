"""reduce_scatter then all_gather moves what one all_reduce moves, and gives the same answer.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.rs_ag_is_all_reduce

A ring all_reduce is two passes around the ring: a reduce-scatter pass (after it,
each rank holds the sum of one 1/N chunk) and an all-gather pass (every rank
collects every summed chunk). Each pass sends S (N-1)/N bytes per rank, so the
pair sends 2 S (N-1)/N, exactly an all_reduce's. FSDP splits the all_reduce at
that seam: the reduce_scatter leaves each rank the gradient of the parameters it
owns, and the all_gather happens later, on the *parameters*, before they are
used. minidist.comm.trace counts the bytes of each call.
"""

from __future__ import annotations

import torch

from minidist import comm
from recipes.lessons.common import Context, main_for

TITLE = "reduce_scatter + all_gather moves what all_reduce moves (traced bytes)"


def run(ctx: Context) -> None:
    n, r = ctx.world, ctx.rank
    numel = (1 << 16 if ctx.small else 1 << 20) // n * n
    g = torch.Generator().manual_seed(r)
    x = torch.randint(-100, 100, (numel,), generator=g).float()   # integers: sums are exact in any order
    rows = []
    with comm.trace() as t_ar:
        whole = x.clone()
        comm.all_reduce(whole)
    with comm.trace() as t_pair:
        mine = torch.empty(numel // n)
        comm.reduce_scatter(mine, x)           # rank r: the sum of chunk r
        both = torch.empty(numel)
        comm.all_gather(both, mine)            # every rank: every summed chunk
    for rec in t_ar.records + t_pair.records:
        rows.append([rec.op, rec.payload_bytes / 2**20, rec.sent_bytes / 2**20])
    ar, pair = t_ar.sent_bytes, t_pair.sent_bytes
    rows.append(["reduce_scatter + all_gather", "", pair / 2**20])
    ctx.say(f"S = {numel * 4 / 2**20:.2f} MiB of fp32 per rank, N = {n}; bytes sent per rank, ring model "
            f"(minidist.comm.trace)")
    ctx.table(["call", "payload S MiB", "sent MiB"], rows)
    same = torch.equal(both, whole)
    ctx.claim(f"reduce_scatter + all_gather send {pair / ar:.3f}x an all_reduce's bytes "
              f"({pair / 2**20:.2f} MiB vs {ar / 2**20:.2f} MiB = 2 S (N-1)/N) and give the identical sum",
              pair == ar == 2 * numel * 4 * (n - 1) // n and same)


if __name__ == "__main__":
    main_for(run, TITLE)
