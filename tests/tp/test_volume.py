"""What tensor and sequence parallelism send: every collective of a step against the Megatron formulas
(the trace), and the bytes the kernel saw leave the process (/proc/self/io) against the trace.

Per block TP runs 2 all_reduces of b*s*h forward and 2 backward; SP replaces each by a
reduce_scatter and an all_gather: the same bytes. What SP adds: the gradients of the
replicated norm weights and row-parallel biases (one all_reduce each per norm or bias) and
the position embedding's all_gather in backward, a few times h elements.
"""

from __future__ import annotations

from collections import Counter

import pytest

from minidist import comm
from minidist.comm import kernel_io
from minidist.models.gpt import GPTConfig
from minidist.tp import cost
from tests.tp.helpers import batches, models, parallel

PLANS = {"tp": {}, "sp": dict(sequence_parallel=True)}


def _step_trace(plan: dict, vocab_parallel: bool, cfg_overrides: dict, batch: int, seq: int):
    _, model, cfg = models(**cfg_overrides)
    model = parallel(model, **plan, vocab_parallel=vocab_parallel)
    (idx, y), = batches(1, batch=batch, seq=seq, vocab=cfg["vocab_size"])
    with comm.trace() as tr:
        model(idx, y)[1].backward()
    return tr, cfg


def _expected(sp: bool, vocab: bool, b: int, s: int, h: int, L: int) -> Counter:
    """(collective, elements of the full tensor) -> how many, for one forward + backward."""
    act = b * s * h
    if not sp:
        want = Counter({("all_reduce", act): 4 * L})
        if vocab:  # the embedding's g forward, the head's f backward; the loss's max, then [target logit, sum exp]
            want += Counter({("all_reduce", act): 2, ("all_reduce", b * s): 1, ("all_reduce", 2 * b * s): 1})
        return want
    want = Counter({("reduce_scatter", act): 4 * L,
                    ("all_gather", act): 4 * L + 2,  # + the embedding's backward and the head's input forward
                    ("all_reduce", 2 * h): 2 * L + 1,  # each norm's weight + bias gradients, coalesced
                    ("all_reduce", h): 2 * L,  # each row-parallel bias's gradient
                    ("all_gather", s * h): 1})  # the position embedding's gradient
    if vocab:  # the embedding's reduce_scatter forward and the head's backward; the loss as above
        want += Counter({("reduce_scatter", act): 2, ("all_reduce", b * s): 1, ("all_reduce", 2 * b * s): 1})
    return want


def body_inventory(sp: bool, vocab: bool) -> tuple[dict, int]:
    b, s = 4, 16
    tr, cfg = _step_trace(PLANS["sp" if sp else "tp"], vocab, {}, b, s)
    got = Counter((r.op, r.numel) for r in tr.records)
    want = _expected(sp, vocab, b, s, cfg["n_embd"], cfg["n_layer"])
    assert got == want, f"collectives {dict(got)}\n expected {dict(want)}"
    formula = cost.collectives(GPTConfig(**cfg), b, s, sequence_parallel=sp, vocab_parallel=vocab)
    assert got == formula, f"collectives {dict(got)}\n minidist.tp.cost says {dict(formula)}"
    return {op: sum(r.sent_bytes for r in tr.records if r.op == op and r.numel == b * s * cfg["n_embd"])
            for op in ("all_reduce", "all_gather", "reduce_scatter")}, tr.sent_bytes


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("vocab", [False, True], ids=["replicated-vocab", "vocab-parallel"])
def test_every_collective_matches_the_formulas(run_dist, world, vocab):
    """The trace holds exactly Megatron's collectives, and SP's activation bytes equal TP's."""
    tp_bytes, _ = run_dist(world, body_inventory, False, vocab)[0]
    sp_bytes, _ = run_dist(world, body_inventory, True, vocab)[0]
    b, s, h, L, e = 4, 16, 32, 2, 4
    per_block = 4 * 2 * b * s * h * e * (world - 1) // world  # 4 all_reduces of b*s*h per block and step
    ends = (2 * 2 * b * s * h * e * (world - 1) // world) if vocab else 0
    assert tp_bytes["all_reduce"] == L * per_block + ends
    assert sp_bytes["all_gather"] + sp_bytes["reduce_scatter"] == tp_bytes["all_reduce"] + (
        0 if vocab else 2 * b * s * h * e * (world - 1) // world)  # replicated head: gather in, embedding: gather back


def body_kernel_bytes(plan: str) -> tuple[int, int, int]:
    big = dict(vocab_size=64, block_size=64, n_layer=1, n_head=4, n_embd=64)
    _, model, cfg = models(**big)
    model = parallel(model, **PLANS[plan], vocab_parallel=True)
    (idx, y), = batches(1, batch=16, seq=64, vocab=64)
    model(idx, y)[1].backward()  # warm up: gloo's first collectives on a group set up its pairs
    model.zero_grad()
    with comm.trace() as tr, kernel_io.written() as w:
        model(idx, y)[1].backward()
    return w.bytes, tr.wire_bytes, sum(r.wire_bytes for r in tr.records if r.numel == 16 * 64 * 64)


@pytest.mark.skipif(not kernel_io.available(), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("world", [2, 4])
def test_kernel_sees_the_same_bytes_for_tp_and_sp(run_dist, world):
    tp = run_dist(world, body_kernel_bytes, "tp")
    sp = run_dist(world, body_kernel_bytes, "sp")
    for rank, ((tp_k, tp_w, tp_act), (sp_k, sp_w, sp_act)) in enumerate(zip(tp, sp)):
        assert tp_act == sp_act, (tp_act, sp_act)  # activation collectives: the same ring bytes
        for kernel, wire in ((tp_k, tp_w), (sp_k, sp_w)):
            assert abs(kernel - wire) <= 0.01 * wire, f"rank {rank}: kernel counted {kernel} B, trace {wire} B"
        # what SP writes beyond TP is its few parameter-sized collectives (position embedding, norms, biases)
        assert abs((sp_k - tp_k) - (sp_w - tp_w)) <= 0.01 * tp_k, (f"rank {rank}: SP wrote {sp_k} B, TP {tp_k} B, "
                                                                   f"expected a difference of {sp_w - tp_w} B")
    print(f"tp={world}: kernel bytes per rank TP {[t[0] for t in tp]}, SP {[s[0] for s in sp]}, "
          f"trace TP {[t[1] for t in tp]} SP {[s[1] for s in sp]}, activation collectives {tp[0][2]}")
