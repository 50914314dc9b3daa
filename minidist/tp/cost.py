"""What the GPT plan sends per training step, by formula: every collective of one forward and backward.

For minidist.tp.parallelize_gpt over N ranks, a batch of b sequences of s tokens, width h,
L blocks (act = b s h elements, the whole activation tensor):

    plan            collectives per step                                  why
    TP              4L all_reduce(act)                                    f and g of attention and MLP, each way
     + vocab        + 2 all_reduce(act), all_reduce(b s), all_reduce(2 b s)  embedding's g, head's f; the loss's
                                                                          max and [target logit, sum of exp]
    TP + SP         4L reduce_scatter(act) + (4L + 2) all_gather(act)     g -> reduce_scatter, f -> all_gather;
                                                                          the replicated head's input, the
                                                                          embedding's gradient
                    + (2L + 1) all_reduce(2h) + 2L all_reduce(h)          norms' weight+bias, row-parallel biases
                    + all_gather(s h)                                     the position embedding's gradient
     + vocab        + 2 reduce_scatter(act), the loss's two all_reduces   (the head is column-parallel then)

Bytes per rank, ring model: an all_reduce of S bytes sends 2 S (N-1)/N, a reduce_scatter or
an all_gather S (N-1)/N. So TP's 4L all_reduces and SP's 4L reduce_scatters + 4L all_gathers
send the same 8 L b s h e (N-1)/N: the activations, not the parameters, set the cost.
tests/tp/test_volume.py holds the trace to this inventory and the kernel's count to the trace.
"""

from __future__ import annotations

from collections import Counter

RING = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
"""Bytes sent per rank by each collective, in units of S (N-1)/N (S: the whole tensor's bytes)."""


def collectives(cfg, batch: int, seq: int, *, sequence_parallel: bool = False,
                vocab_parallel: bool = False) -> Counter:
    """{(collective, elements of the whole tensor): calls} of one forward + backward of the GPT plan."""
    L, h = cfg.n_layer, cfg.n_embd
    act, tokens = batch * seq * h, batch * seq
    loss = Counter({("all_reduce", tokens): 1, ("all_reduce", 2 * tokens): 1}) if vocab_parallel else Counter()
    if not sequence_parallel:
        return Counter({("all_reduce", act): 4 * L + (2 if vocab_parallel else 0)}) + loss
    return Counter({("reduce_scatter", act): 4 * L + (2 if vocab_parallel else 0), ("all_gather", act): 4 * L + 2,
                    ("all_reduce", 2 * h): 2 * L + 1, ("all_reduce", h): 2 * L, ("all_gather", seq * h): 1}) + loss


def step_bytes(cfg, batch: int, seq: int, tp: int, *, sequence_parallel: bool = False, vocab_parallel: bool = False,
               element_size: int = 4) -> float:
    """Bytes each rank sends in one forward + backward (ring model; 0 at tp = 1)."""
    calls = collectives(cfg, batch, seq, sequence_parallel=sequence_parallel, vocab_parallel=vocab_parallel)
    return sum(RING[op] * n * numel * element_size for (op, numel), n in calls.items()) * (tp - 1) / tp


def activation_bytes(cfg, batch: int, seq: int, tp: int, element_size: int = 4) -> float:
    """The part that grows with the tokens: 8 L b s h e (N-1)/N (TP's all_reduces, or SP's pairs)."""
    return 8 * cfg.n_layer * batch * seq * cfg.n_embd * element_size * (tp - 1) / tp
