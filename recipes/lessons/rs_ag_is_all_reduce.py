"""reduce_scatter then all_gather moves what one all_reduce moves, and gives the same answer.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.rs_ag_is_all_reduce

A ring all_reduce is two passes around the ring: a reduce-scatter pass (after it,
each rank holds the sum of one 1/N chunk) and an all-gather pass (every rank
collects every summed chunk). Each pass sends S (N-1)/N bytes per rank, so the
pair sends 2 S (N-1)/N, exactly an all_reduce's. FSDP splits the all_reduce at
that seam: the reduce_scatter leaves each rank the gradient of the parameters it
owns, and the all_gather happens later, on the *parameters*, before they are
used.

The bytes are counted twice: by minidist.comm.trace (the ring model's count of
each call: a formula) and by the kernel (what each process really wrote to
gloo's sockets, minidist.comm.kernel_io). The claim rests on the kernel's count.
On gloo, minidist.comm.reduce_scatter runs minidist's own ring (minidist/comm/ring.py):
gloo's own reduce_scatter is an all_reduce inside and would write twice as much
(lesson 8).
"""

from __future__ import annotations

import torch

from minidist import comm
from recipes.lessons.common import Context, kernel_bytes, main_for

TITLE = "reduce_scatter + all_gather moves what all_reduce moves (bytes the kernel counted)"

CLAIM = ("reduce_scatter + all_gather write {pair:.2f} MiB per rank (the kernel's count), {ratio:.3f}x an "
         "all_reduce's {ar:.2f} MiB (2 S (N-1)/N = {formula:.2f} MiB), and give the identical sum")


def run(ctx: Context) -> None:
    n, r = ctx.world, ctx.rank
    numel = (1 << 16 if ctx.small else 1 << 20) // n * n
    g = torch.Generator().manual_seed(r)
    x = torch.randint(-100, 100, (numel,), generator=g).float()   # integers: sums are exact in any order
    whole, mine, both = x.clone(), torch.empty(numel // n), torch.empty(numel)

    calls = {"all_reduce": lambda: comm.all_reduce(whole),
             "reduce_scatter": lambda: comm.reduce_scatter(mine, x),   # rank r: the sum of chunk r
             "all_gather": lambda: comm.all_gather(both, mine)}        # every rank: every summed chunk
    rows, kernel = [], {}
    for name, call in calls.items():
        with comm.trace() as t:
            kernel[name] = kernel_bytes(call)
        rows.append([name, t.records[0].payload_bytes / 2**20, t.sent_bytes / 2**20, kernel[name] / 2**20])
    ar, pr = kernel["all_reduce"], kernel["reduce_scatter"] + kernel["all_gather"]
    rows.append(["reduce_scatter + all_gather", "", rows[1][2] + rows[2][2], pr / 2**20])
    S = numel * 4
    formula = 2 * S * (n - 1) / n
    ctx.say(f"S = {S / 2**20:.2f} MiB of fp32 per rank, N = {n}; bytes per rank: the trace's ring model, and "
            f"what the kernel saw each process write (minidist.comm.kernel_io, mean over ranks)")
    ctx.table(["call", "payload S MiB", "trace MiB", "kernel MiB"], rows)
    same = torch.equal(both, whole)
    ctx.claim(CLAIM.format(pair=pr / 2**20, ratio=pr / ar, ar=ar / 2**20, formula=formula / 2**20),
              abs(pr / ar - 1) < 0.01 and abs(ar / formula - 1) < 0.01 and same)


if __name__ == "__main__":
    main_for(run, TITLE)
