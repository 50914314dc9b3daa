"""The checks of the context-parallel rung: causal ring attention with the online softmax.

Every rank builds the same q, k, v for the whole sequence and keeps its contiguous chunk of the
tokens; the learner's ring_attention(q_r, k_r, v_r) must give that chunk's rows of causal
softmax attention over the whole sequence, and the chunk's gradients of q, k and v (the keys'
and values' from every later query, wherever it lives); move only keys, values and their
gradients, point to point (the forward exactly 2 (N-1) blocks per rank, the kernel's count);
and keep for backward no more than its own tokens need (no score matrix, no other rank's block).
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.distributed as dist
import torch.nn.functional as F

from minidist.tutorial.check.instruments import Memory, Profiled, kernel_bytes, largest_difference, over_ranks
from minidist.tutorial.check.models import seeded
from minidist.tutorial.check.verdict import Check, Verdict, kib

B, HEADS, S, D = 2, 2, 256, 16
"""A block (one rank's k or v) is B HEADS (S/N) D floats: 32 KiB at N = 2, where gloo's headers stay small;
its scores against one block, (S/N)^2 per head, are 8 blocks' worth."""


def whole(seed: int = 60) -> list[torch.Tensor]:
    """q, k, v and a weighting of the output, for the whole sequence: the same on every rank."""
    return [torch.randn(B, HEADS, S, D, generator=seeded(seed + i)) for i in range(4)]


def mine(t: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous chunk of the tokens, a leaf of its own."""
    return t.chunk(dist.get_world_size(), dim=2)[dist.get_rank()].clone().requires_grad_()


def block_bytes() -> int:
    return B * HEADS * S // dist.get_world_size() * D * 4


def equals_one_process(mod: ModuleType) -> Verdict:
    q, k, v, w = whole()
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True)
    (ref * w).sum().backward()
    local = [mine(t) for t in (q, k, v)]
    out = mod.ring_attention(*local)
    (out * mine(w).detach()).sum().backward()
    n, r = dist.get_world_size(), dist.get_rank()
    pairs = {"output": (out, ref.chunk(n, 2)[r])}
    pairs.update({f"{name}'s gradient": (a.grad, b.grad.chunk(n, 2)[r]) for name, a, b in zip("qkv", local, full)})
    worst, err = largest_difference(pairs)
    return Verdict(err < 1e-5, f"largest difference from causal attention on one process: {err:.1e} ({worst}; want "
                   f"< 1e-5 for the chunk's output and its q, k and v gradients)")


def traffic(mod: ModuleType) -> Verdict:
    q, k, v, w = whole()
    local = [mine(t) for t in (q, k, v)]
    n, blk = dist.get_world_size(), block_bytes()
    box = {}
    fwd, _ = kernel_bytes(lambda: box.update(out=mod.ring_attention(*local)))
    bwd, _ = kernel_bytes(lambda: (box["out"] * mine(w).detach()).sum().backward())
    with Profiled() as p:
        with p.window("step"):
            (mod.ring_attention(*local) * mine(w).detach()).sum().backward()
    p2p = p.count("c10d::send", "step") + p.count("c10d::recv_", "step")
    collectives = over_ranks(p.count("c10d::", "step") - p2p)
    sends = over_ranks(p.count("c10d::send", "step"), dist.ReduceOp.MIN)
    f_blocks, b_blocks = fwd / blk, bwd / blk
    ok = collectives == 0 and sends > 0 and 0.99 <= f_blocks / (2 * (n - 1)) <= 1.05 and \
        0.99 * 4 * (n - 1) <= b_blocks <= 1.05 * 4 * n
    return Verdict(ok, f"per rank (the kernel's count, mean), in blocks of {kib(blk)}: forward {f_blocks:.2f} (want "
                   f"2 (N-1) = {2 * (n - 1)}: k and v once around, never q), backward {b_blocks:.2f} (want 4 (N-1) "
                   f"to 4 N: k, v and their gradients); {int(collectives)} collectives besides sends and receives "
                   f"(torch's profiler; want 0)")


def kept_memory(mod: ModuleType) -> Verdict:
    q, k, v, _ = whole()
    local = [mine(t) for t in (q, k, v)]
    with Memory(*local) as mem:
        out = mod.ring_attention(*local)
    del out
    blk = block_bytes()
    kept = over_ranks(mem.kept)
    lse = blk / D
    return Verdict(kept <= blk + lse + 1024, f"the forward leaves {kib(kept)} alive (torch's MemTracker; want at most "
                   f"its output and lse, {kib(blk + lse)}: q, k, v are the caller's, and no score matrix "
                   f"({kib(8 * blk)} per visiting block) nor another rank's k, v may outlive it)")


CHECKS = {"cp": (Check("equal to one process", equals_one_process),
                 Check("point to point, bytes per step", traffic),
                 Check("activation memory", kept_memory))}
