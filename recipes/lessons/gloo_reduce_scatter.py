"""gloo's reduce_scatter is an all_reduce inside: the bytes of a whole all_reduce, and its time.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.gloo_reduce_scatter

A ring reduce_scatter sends S (N-1)/N bytes per rank, half of an all_reduce's
2 S (N-1)/N, and should take about as long as an all_gather of the same S.
minidist.comm.trace counts the logical bytes of the collective that was asked
for. But torch's gloo backend carries out reduce_scatter_tensor by cloning the
input, all_reducing the clone on every rank and keeping one chunk, so what goes
on the wire is an all_reduce's bytes, and its wall time tracks the all_reduce,
not the all_gather. The kernel's byte count (what each process really wrote to
gloo's sockets, minidist.comm.kernel_io) shows it without a clock. On NCCL the
reduce_scatter is a real one, and the times line up with the bytes.

This is why FSDP on gloo used to look slower than the cost model predicts, and why
minidist.comm.reduce_scatter runs its own ring of point-to-point sends on gloo
(minidist/comm/ring.py, algorithm="auto"): the last row shows it writing what a
ring should.
"""

from __future__ import annotations

import torch

from minidist import comm
from recipes.lessons.common import Context, interleaved_times, kernel_bytes, main_for

TITLE = "gloo's reduce_scatter is an all_reduce inside (bytes the kernel counted, wall time)"

CLAIM = ("asked for half an all_reduce's bytes, gloo's reduce_scatter writes {native:.2f}x an all_reduce's (the "
         "kernel's count) and takes {time_ratio:.2f}x its time (> 0.7), {vs_gather:.2f}x an all_gather's; "
         "minidist's ring writes {ring:.2f}x and takes {ring_time:.2f}x")


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
    sent, written = {}, {}
    for name, op in ops.items():
        with comm.trace() as t:
            written[name] = kernel_bytes(op)
        sent[name] = t.sent_bytes
    times = interleaved_times(ops, repeats=4 if ctx.small else 10)
    model = comm.calibrate(iters=3 if ctx.small else 10)
    S = numel * 4
    ctx.say(f"S = {S / 2**20:.0f} MiB of fp32, N = {n}, gloo; trace: the ring model's bytes of the call asked for; "
            f"kernel: what each process wrote (mean over ranks); median of interleaved calls; ring prediction "
            f"from comm.calibrate()")
    ctx.table(["op", "trace MiB", "kernel MiB", "time ms", "ring ms", "time / all_reduce's"],
              [[op, sent[op] / 2**20, written[op] / 2**20, times[op] * 1e3, model.predict(op.split()[0], S, n) * 1e3,
                times[op] / times["all_reduce"]] for op in ops])
    native = written["reduce_scatter"] / written["all_reduce"]
    ring = written["reduce_scatter (ring)"] / written["all_reduce"]
    time_ratio = times["reduce_scatter"] / times["all_reduce"]
    ctx.claim(CLAIM.format(native=native, time_ratio=time_ratio, vs_gather=times["reduce_scatter"] / times["all_gather"],
                           ring=ring, ring_time=times["reduce_scatter (ring)"] / times["all_reduce"]),
              abs(native - 1) < 0.01 and abs(ring - 0.5) < 0.01,
              timing_holds=time_ratio > 0.7)


if __name__ == "__main__":
    main_for(run, TITLE)
