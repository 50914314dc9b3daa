"""Emulated compute (GPTConfig.emulate_flops_per_s, minidist.models.emulated): the GPT's forward takes its matmuls'
FLOPs / rate, its backward twice that, a recomputed forward once more; the values are the plain model's."""

import time

import pytest
import torch

from minidist.models.gpt import GPT, GPTConfig

SHAPE = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
B, S = 2, 16
FLOPS = B * S * (2 * (24 * 32 ** 2 + 2 * S * 32) + 2 * 64 * 32)
"""Forward FLOPs: per token and block 24 h^2 (qkv, proj, fc, proj) + 2 s h (causal attention), and the head's 2 V h."""
RATE = FLOPS / 0.04  # a 40 ms forward


def _timed(rate: float, recompute: bool = False) -> tuple[float, float, torch.Tensor, list]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, emulate_flops_per_s=rate, activation_checkpointing=recompute))
    x = torch.randint(0, 64, (B, S))
    model(x, x)  # first call: one-time costs
    t0 = time.perf_counter()
    loss = model(x, x)[1]
    t1 = time.perf_counter()
    loss.backward()
    return t1 - t0, time.perf_counter() - t1, loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.alone
def test_emulated_gpt_takes_its_flops_at_the_rate_and_computes_the_same():
    plain = _timed(0.0)
    fwd, bwd, loss, grads = _timed(RATE)
    assert torch.equal(loss, plain[2]) and all(torch.equal(a, b) for a, b in zip(grads, plain[3]))
    seconds = FLOPS / RATE
    assert seconds <= fwd < seconds + 0.1, fwd  # the module's own CPU time inside each kernel
    assert 2 * seconds <= bwd < 2 * seconds + 0.15, bwd
    blocks = seconds - B * S * 2 * 64 * 32 / RATE  # under recompute the blocks' forward runs again in backward
    _, bwd_recompute, loss_recompute, _ = _timed(RATE, recompute=True)
    assert torch.equal(loss_recompute, loss)
    assert 2 * seconds + blocks <= bwd_recompute < 2 * seconds + blocks + 0.15, bwd_recompute
