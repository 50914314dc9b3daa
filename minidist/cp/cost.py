"""What context parallelism sends per training step, by formula (checked against the kernel's count in tests/cp).

For cp ranks, b sequences of s tokens, width h (all heads), L layers, element size e, one
block = the keys (or the values) of one rank's tokens, b (s/cp) h e bytes:

    rotate       forward per layer           backward per layer              why
    ring         2 (cp-1) blocks: k and v    4 (cp-1): k, v again and their  each block visits the cp-1 others,
                 sent on cp-1 times          gradients sent home             nothing whole is kept
    all_gather   2 (cp-1): all_gather(k, v)  2 (cp-1): reduce_scatter(dk, dv)  the whole sequence's k, v kept

So the ring sends 6 (cp-1)/cp b s h e per layer and step, the all_gather variant 4 (cp-1)/cp
b s h e (minidist.comm's ring reduce_scatter; gloo's own would send twice as much), plus one
all_reduce of the loss (a scalar) per step. Both grow with the tokens and the layers, like
tensor parallelism's 8 (N-1)/N b s h e per layer (minidist.tp.cost), not with the parameters.

But cp ranks hold the same weights: their gradients are reduced over cp too (with data
parallelism, over dp x cp), 2 psi e (N-1)/N per rank as DDP's over N ranks. Against tensor
parallelism over the same N ranks (which splits the weights and reduces nothing):

    CP: 6 L b s h e (N-1)/N + 2 psi e (N-1)/N        TP: 8 L b s h e (N-1)/N

CP sends less once b s > psi / (L h) tokens per step: for psi ~ 12 L h^2, beyond ~12 h tokens.
"""

from __future__ import annotations

from minidist.cp.plan import Rotate

BLOCKS = {Rotate.RING: (2, 4), Rotate.ALL_GATHER: (2, 2)}
"""(forward, backward) blocks each rank sends per layer, in units of (cp-1) blocks."""


def block_bytes(batch: int, seq: int, width: int, cp: int, element_size: int = 4) -> int:
    """One rank's keys (or values) of every head: b (s/cp) h e."""
    return batch * (seq // cp) * width * element_size


def layer_bytes(batch: int, seq: int, width: int, cp: int, rotate: Rotate = Rotate.RING,
                element_size: int = 4) -> tuple[int, int]:
    """(forward, backward) bytes each rank sends per attention layer."""
    block = block_bytes(batch, seq, width, cp, element_size)
    fwd, bwd = BLOCKS[rotate]
    return fwd * (cp - 1) * block, bwd * (cp - 1) * block


LOSS_BYTES = 16
"""The loss's one all_reduce over cp per step: two float64s, the scored targets' loss sum and their count
(minidist.cp.plan.mean_value_over: a mean over every scored target of the group, not a mean of means)."""


def step_bytes(cfg, batch: int, seq: int, cp: int, rotate: Rotate = Rotate.RING, element_size: int = 4,
               tp: int = 1) -> float:
    """Bytes each rank sends for context parallelism in one forward + backward of the GPT (the loss's all_reduce
    included; not the gradient reduction over cp, which is the data-parallel engine's). Heads split over `tp`
    ranks leave each rank 1/tp of the width."""
    fwd, bwd = layer_bytes(batch, seq, cfg.n_embd // tp, cp, rotate, element_size)
    return cfg.n_layer * (fwd + bwd) + 2 * LOSS_BYTES * (cp - 1) / cp


def crossing_tokens(psi: int, n_layer: int, width: int) -> float:
    """Tokens per step (b s) beyond which CP + its gradient reduction sends less than TP, over the same ranks."""
    return psi / (n_layer * width)
