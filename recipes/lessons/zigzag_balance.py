"""Causal attention over contiguous chunks leaves the first ranks idle; zigzag chunks give every rank the same work.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.zigzag_balance     (and --nproc_per_node=4)

Under a causal mask a query sees only the keys before it. Cut the sequence into cp contiguous
chunks and rank r's queries need the keys of ranks 0..r: rank 0 computes its diagonal block
and waits, the last rank computes cp of them, and the ring goes at the last rank's pace.
Zigzag gives rank r chunks r and 2cp-1-r of 2cp (one early, one late): every rank the same
number of chunk pairs (minidist.cp.chunks). With contiguous chunks the slowest rank needs
2 - 1/cp times the mean (a diagonal pair is half a pair); counted in the tiles minidist
really computes (minidist.cp.blocks: up to 256 x 256, those above a diagonal skipped) a little
less, as a diagonal pair of m tiles a side costs m (m+1) / 2 of them, not m^2 / 2.

Measured: each rank's busy time in one forward + backward of ring attention, as the CPU time
of its own thread (time.thread_time: the kernel's per-thread clock), on real compute. Why
not wall-clock, nor emulated compute: with N processes on 2 shared cores a rank's wall time
is mostly the scheduler's, and a sleep proportional to the chunk pairs would be the formula
compared with itself; the CPU time a thread consumed is its own work, whoever else runs
(gloo's send and receive run on gloo's threads, and a blocked wait costs none). The fastest
of a few repeats per rank, after a warm-up.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from minidist.cp import Chunking, positions, ring_attention
from minidist.cp.blocks import Pairs
from recipes.lessons.common import Context, main_for

TITLE = "Zigzag chunks balance causal ring attention: per-rank busy time, contiguous against zigzag"

CLAIM = ("the slowest rank's busy time in ring attention is {contiguous:.2f}x the mean with contiguous chunks "
         "(tiles computed: {contiguous_pairs:.2f}x; causal attention's 2 - 1/cp = {ideal:.2f}x) and {zigzag:.2f}x with "
         "zigzag ({zigzag_pairs:.2f}x) (thread CPU time, N = {n})")


def sizes(small: bool) -> tuple[int, int, int]:
    """(sequence length, heads, repeats)."""
    return (2048, 4, 3) if small else (4096, 4, 5)


def busy(chunking: Chunking, q, k, v, repeats: int) -> float:
    """This rank's least thread CPU time over `repeats` forward + backward passes (after one warm-up)."""
    cp, rank = dist.get_world_size(), dist.get_rank()
    local = [t[:, :, positions(t.shape[2], cp, rank, chunking)] for t in (q, k, v)]
    times = []
    for i in range(repeats + 1):
        inputs = [t.clone().requires_grad_() for t in local]
        dist.barrier()
        start = time.thread_time()
        ring_attention(*inputs, dist.group.WORLD, chunking).sum().backward()
        times.append(time.thread_time() - start)
    return min(times[1:])


def tiles(s: int, cp: int, rank: int, chunking: Chunking) -> int:
    """The tiles rank `rank`'s ring attention computes over all steps (forward; backward the same)."""
    return sum(len(Pairs.of(cp, rank, src, chunking).tiles(s // cp)) for src in range(cp))


def run(ctx: Context) -> None:
    s, heads, repeats = sizes(ctx.small)
    n = ctx.world
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, s, 32, generator=g) for _ in range(3))
    times = {}
    for chunking in Chunking:
        mine = torch.tensor([busy(chunking, q, k, v, repeats)], dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(n)]
        dist.all_gather(every, mine)
        times[chunking] = [t.item() for t in every]
    pairs = {c: [tiles(s, n, r, c) for r in range(n)] for c in Chunking}
    rows = [[r] + [x for c in Chunking for x in (times[c][r] * 1e3, pairs[c][r])] for r in range(n)]
    ctx.say(f"ring attention, forward + backward, one sequence of {s} tokens, {heads} heads of 32, N = {n}; "
            f"per rank: CPU ms of its own thread (least of {repeats}) and the tiles it computes")
    ctx.table(["rank", "contiguous ms", "contiguous tiles", "zigzag ms", "zigzag tiles"], rows)

    def imbalance(values):
        return max(values) / (sum(values) / len(values))

    c, z = imbalance(times[Chunking.CONTIGUOUS]), imbalance(times[Chunking.ZIGZAG])
    cw, zw = imbalance(pairs[Chunking.CONTIGUOUS]), imbalance(pairs[Chunking.ZIGZAG])
    ctx.claim(CLAIM.format(contiguous=c, contiguous_pairs=cw, ideal=2 - 1 / n, zigzag=z, zigzag_pairs=zw, n=n),
              zw == 1.0 and 1 + 0.8 * (1 - 1 / n) < cw < 2 - 1 / n,
              c > 1 + 0.5 * (cw - 1) and z < 1 + 0.5 * (c - 1))


if __name__ == "__main__":
    main_for(run, TITLE)
