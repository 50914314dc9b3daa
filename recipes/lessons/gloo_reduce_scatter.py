"""gloo's reduce_scatter is an all_reduce inside: half the logical bytes, the same wall time.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.gloo_reduce_scatter

A ring reduce_scatter sends S (N-1)/N bytes per rank, half of an all_reduce's
2 S (N-1)/N, and should take about as long as an all_gather of the same S.
minidist.comm.trace counts the logical bytes of the collective that was asked
for. gloo (the CPU backend) carries out a reduce_scatter by reducing the whole
tensor on every rank and keeping one chunk, so its wall time tracks the
all_reduce, not the all_gather. On NCCL the three times line up with the bytes.
This is why FSDP on gloo used to look slower than the cost model predicts, and why
minidist.comm.reduce_scatter runs its own ring of point-to-point sends on gloo
(minidist/comm/ring.py, algorithm="auto"): the last row shows it moving what a ring should.
"""

from __future__ import annotations

import torch

from minidist import comm
from recipes.lessons.common import Context, interleaved_times, main_for

TITLE = "gloo's reduce_scatter is an all_reduce inside (wall time vs logical bytes)"


def run(ctx: Context) -> None:
    n = ctx.world
    numel = (1 << 20 if ctx.small else 1 << 22) // n * n        # 4 MiB (small) or 16 MiB of fp32
    full, chunk = torch.ones(numel), torch.empty(numel // n)
    gathered = torch.empty(numel)
    ops = {
        "all_reduce": lambda: comm.all_reduce(full),
        "reduce_scatter": lambda: comm.reduce_scatter(chunk, full, algorithm="native"),
        "all_gather": lambda: comm.all_gather(gathered, chunk),
        "reduce_scatter (ring)": lambda: comm.reduce_scatter(chunk, full, algorithm="ring"),
    }
    with comm.trace() as t:
        for op in ops.values():
            op()
    sent = dict(zip(ops, (r.sent_bytes for r in t.records)))
    times = interleaved_times(ops, repeats=4 if ctx.small else 10)
    model = comm.calibrate(iters=3 if ctx.small else 10)
    S = numel * 4
    ctx.say(f"S = {S / 2**20:.0f} MiB of fp32, N = {n}, gloo; median of interleaved calls; "
            f"ring prediction from comm.calibrate()")
    ctx.table(["op", "sent MiB (trace)", "time ms", "ring ms", "time / all_reduce's"],
              [[op, sent[op] / 2**20, times[op] * 1e3, model.predict(op.split()[0], S, n) * 1e3,
                times[op] / times["all_reduce"]] for op in ops])
    bytes_ratio = sent["reduce_scatter"] / sent["all_reduce"]
    time_ratio = times["reduce_scatter"] / times["all_reduce"]
    ctx.claim(f"reduce_scatter sends {bytes_ratio:.2f}x an all_reduce's bytes but takes "
              f"{time_ratio:.2f}x its time (> 0.7) and {times['reduce_scatter'] / times['all_gather']:.2f}x "
              f"an all_gather's on gloo; minidist's ring takes {times['reduce_scatter (ring)'] / times['all_reduce']:.2f}x",
              bytes_ratio == 0.5, timing_holds=time_ratio > 0.7)


if __name__ == "__main__":
    main_for(run, TITLE)
