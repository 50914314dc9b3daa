"""What context-parallel attention sends, counted by the kernel (/proc/self/io: the bytes each process wrote
to gloo's sockets), against the formulas of minidist.cp.cost: per layer, the ring's 2 (cp-1) blocks forward
and 4 (cp-1) backward, the all_gather variant's 2 (cp-1) each way (block = b (s/cp) h e)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.comm import kernel_io
from minidist.cp import Chunking, Rotate, all_gather_attention, cost, ring_attention
from tests.cp.helpers import mine, qkv

B, HEADS, S, D = 2, 4, 256, 16
ATTEND = {Rotate.RING: ring_attention, Rotate.ALL_GATHER: all_gather_attention}


def body_bytes() -> dict:
    cp, group = dist.get_world_size(), dist.group.WORLD
    out = {}
    for rotate in Rotate:
        local = [mine(t, Chunking.ZIGZAG).requires_grad_() for t in qkv(B, HEADS, S, D, dtype=torch.float32)]
        with comm.trace() as tr, kernel_io.written(group) as fwd:
            y = ATTEND[rotate](*local, group, Chunking.ZIGZAG)
        with kernel_io.written(group) as bwd:
            y.sum().backward()
        traced = sum(r.wire_bytes for r in tr.records)
        out[rotate.value] = (fwd.bytes, bwd.bytes, traced)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_kernel_bytes_match_the_formulas(run_dist, world):
    for r, got in enumerate(run_dist(world, body_bytes)):
        for rotate in Rotate:
            fwd, bwd, traced = got[rotate.value]
            want_fwd, want_bwd = cost.layer_bytes(B, S, HEADS * D, world, rotate)
            assert traced == want_fwd, (rotate, traced, want_fwd)  # the trace's model of the forward: exact
            # gloo adds a small header per message: within 2% of the payload
            assert want_fwd <= fwd <= 1.02 * want_fwd, f"rank {r} {rotate} forward: kernel {fwd}, formula {want_fwd}"
            assert want_bwd <= bwd <= 1.02 * want_bwd, f"rank {r} {rotate} backward: kernel {bwd}, formula {want_bwd}"
        print(world, "rank", r, {k: (f, b) for k, (f, b, _) in got.items()},
              "formula ring", cost.layer_bytes(B, S, HEADS * D, world))
