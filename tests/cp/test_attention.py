"""One layer's attention under context parallelism equals full causal attention on one process: the output
and the gradients of q, k and v, for the ring and the all_gather variant, contiguous and zigzag, at cp = 2
and 4 (float64: the merge is exact up to rounding, so the tolerance is tight)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.cp import blocks
from minidist.cp import Chunking, Rotate, all_gather_attention, ring_attention, unshard_sequence
from tests.cp.helpers import VARIANTS, full_attention, mine, qkv

ATTEND = {Rotate.RING: ring_attention, Rotate.ALL_GATHER: all_gather_attention}
TOL = dict(rtol=1e-10, atol=1e-12)


def body_attention_equals_full(tile: int | None = None) -> dict:
    saved, blocks.TILE = blocks.TILE, tile or blocks.TILE
    try:
        return _attention_equals_full()
    finally:
        blocks.TILE = saved


def _attention_equals_full() -> dict:
    q, k, v = qkv()
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(9), dtype=q.dtype)
    want = full_attention(q, k, v, dout)
    group, worst = dist.group.WORLD, {}
    for rotate, chunking in VARIANTS:
        local = [mine(t, chunking).requires_grad_() for t in (q, k, v)]
        out = ATTEND[rotate](*local, group, chunking)
        out.backward(mine(dout, chunking))
        got = [out.detach()] + [t.grad for t in local]
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
            torch.testing.assert_close(g, mine(w, chunking), **TOL, msg=lambda m: f"{rotate} {chunking} {name}: {m}")
        whole = unshard_sequence(out.detach(), 2, group, chunking)  # every token back in its place
        torch.testing.assert_close(whole, want[0], **TOL)
        worst[f"{rotate.value} {chunking.value}"] = max((g - mine(w, chunking)).abs().max().item()
                                                        for g, w in zip(got, want))
    return worst


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_attention_equals_full_attention(run_dist, world):
    worst = run_dist(world, body_attention_equals_full)
    print(world, "max |difference| per variant, rank 0:", worst[0])


def test_tiles_inside_a_chunk_pair_merge_to_the_same(run_dist):
    """Tiles of 3 tokens: chunks of 8 (contiguous) and 4 (zigzag) cut unevenly, diagonal tiles skipped above."""
    run_dist(2, body_attention_equals_full, 3)


def body_ring_messages(chunking: Chunking) -> list[tuple[str, int, str]]:
    q, k, v = (mine(t, chunking).requires_grad_() for t in qkv(seq=32))
    with comm.trace() as tr:
        ring_attention(q, k, v, dist.group.WORLD, chunking).sum().backward()
    return [(r.op, r.payload_bytes, r.group.split(":")[-1]) for r in tr.records]


def test_the_ring_sends_to_the_next_rank_and_receives_from_the_previous(run_dist):
    """Forward cp-1 sends of (k, v), backward cp-1 of (k, v) and cp-1 of their gradients; only to r+1."""
    n = 4
    for r, records in enumerate(run_dist(n, body_ring_messages, Chunking.ZIGZAG)):
        block = 2 * 3 * (32 // n) * 8 * 8  # one rank's k (or v): batch 2, 3 heads, 8 tokens, dim 8, float64
        sends = [(b, ch) for op, b, ch in records if op == "send"]
        recvs = [(b, ch) for op, b, ch in records if op == "recv"]
        assert sends == [(2 * block, f"{r}>{(r + 1) % n}")] * (3 * (n - 1)), sends
        assert recvs == [(2 * block, f"{(r - 1) % n}>{r}")] * (3 * (n - 1)), recvs
