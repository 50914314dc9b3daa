"""minidist's ring attention against PyTorch's context parallelism (torch.distributed.tensor.experimental).

Torch's public `context_parallel` does not run on this machine's CPU: it swaps
F.scaled_dot_product_attention for a DTensor dispatch whose ring handles only the CUDA
kernels (aten._scaled_dot_product_flash_attention, _efficient_attention, _cudnn_attention),
and on the CPU SDPA calls aten._scaled_dot_product_flash_attention_for_cpu, which has no
context-parallel handler and no DTensor sharding strategy. The first test tries it and, when
it raises, skips with torch's own words; if a later torch runs it, the test compares.

Torch's ring itself is a function of the attention kernel (_templated_ring_attention and its
backward, the code context_parallel dispatches the CUDA kernels to), so the second test runs
it with the CPU kernel on gloo and holds minidist's ring to it: outputs and the gradients of
q, k, v, unbalanced (contiguous) and with torch's head-tail load balancing (minidist's zigzag:
the same chunks). Private API: a torch upgrade may rename it; the test then says so.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from minidist.cp import Chunking, ring_attention
from tests.cp.helpers import cp_mesh, full_attention, mine, qkv

TOL = dict(rtol=1e-10, atol=1e-12)
aten = torch.ops.aten


def body_public_context_parallel():
    """("ran", max difference to full attention) or ("raised", torch's message)."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    q, k, v = qkv(dtype=torch.float32)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mesh = cp_mesh()
    cq, ck, cv = (t.clone() for t in (q, k, v))
    try:
        with context_parallel(mesh, buffers=[cq, ck, cv], buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
            whole = context_parallel_unshard(mesh, [out], [2])[0]
    except (NotImplementedError, RuntimeError) as e:
        return "raised", f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return "ran", (whole - want).abs().max().item()


def test_torch_context_parallel_on_this_machine(run_dist):
    kind, what = run_dist(2, body_public_context_parallel)[0]
    if kind == "raised":
        pytest.skip(f"torch {torch.__version__}'s context_parallel does not run on CPU/gloo: SDPA on the CPU is "
                    f"aten._scaled_dot_product_flash_attention_for_cpu, which context parallelism does not handle "
                    f"(its ring takes the CUDA flash, efficient and cuDNN kernels only); torch says: {what}")
    assert what < 1e-5, f"torch's context_parallel differs from full attention by {what}"


def _cpu_forward(query, key, value, is_causal, **_):
    return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal)


def _cpu_backward(grad_out, query, key, value, out, logsumexp, is_causal, **_):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
                                                                     0.0, is_causal)


@contextlib.contextmanager
def _torch_options(load_balance: bool):
    """Torch's ring in float64 throughout (its default upcasts to float32), balanced or not; restored after."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options
    saved = (_cp_options.enable_load_balance, _cp_options.convert_to_f32)
    _cp_options.enable_load_balance, _cp_options.convert_to_f32 = load_balance, False
    try:
        yield
    finally:
        _cp_options.enable_load_balance, _cp_options.convert_to_f32 = saved


def body_torch_ring() -> dict:
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention, _templated_ring_attention_backward)
    q, k, v = qkv()
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(9), dtype=q.dtype)
    group, worst = dist.group.WORLD, {}
    for chunking, balanced in ((Chunking.CONTIGUOUS, False), (Chunking.ZIGZAG, True)):
        local = [mine(t, chunking).contiguous() for t in (q, k, v)]
        d_local = mine(dout, chunking).contiguous()
        with _torch_options(balanced):
            out, lse = _templated_ring_attention(group, 2, _cpu_forward, *local, is_causal=True)[:2]
            theirs = [out, *_templated_ring_attention_backward(group, 2, _cpu_backward, d_local, "grad_out", *local,
                                                                out, lse, is_causal=True)[:3]]
        ours_in = [t.clone().requires_grad_() for t in local]
        ours_out = ring_attention(*ours_in, group, chunking)
        ours_out.backward(d_local)
        ours = [ours_out.detach()] + [t.grad for t in ours_in]
        for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
            torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{chunking} {name}: {m}")
        want = full_attention(q, k, v, dout)  # and both are full attention
        torch.testing.assert_close(ours[0], mine(want[0], chunking), **TOL)
        worst[chunking.value] = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    return worst


@pytest.mark.parametrize("world", [2, 4])
def test_minidist_ring_equals_torch_ring(run_dist, world):
    print(world, "max |minidist - torch|:", run_dist(world, body_torch_ring)[0])
