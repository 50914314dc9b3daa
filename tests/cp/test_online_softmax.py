"""The online-softmax merge and its backward: blocks of keys merged in any order are full attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minidist.cp.online_softmax import attend_block, attend_block_backward, merge_


def test_merged_blocks_in_any_order_are_attention_over_all_keys():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k[..., 7, :] *= 1000  # scores near +-1000: exp() of them overflows float64, exp() of (score - max) cannot
    want = F.scaled_dot_product_attention(q, k, v)
    for order in ([0, 1, 2], [2, 0, 1]):
        out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        for i in order:
            merge_(out, lse, *attend_block(q, k[..., 4 * i:4 * i + 4, :], v[..., 4 * i:4 * i + 4, :], False))
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-2, -1) / 8 ** 0.5, -1))


def test_block_backward_from_the_final_lse_is_autograd_of_full_attention():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    out.backward(dout)
    o, lse = attend_block(q.detach(), k.detach(), v.detach(), diagonal=True)
    delta = (dout * o).sum(-1)
    # keys 0..2 and 3..5 as two blocks: the first is diagonal for queries 0..2, full for 3..5
    grads = [torch.zeros(1, 2, 6, 4, dtype=torch.float64) for _ in range(3)]
    for qs, ks, diagonal in ((slice(0, 3), slice(0, 3), True), (slice(3, 6), slice(0, 3), False),
                             (slice(3, 6), slice(3, 6), True)):
        gq, gk, gv = attend_block_backward(dout[..., qs, :], delta[..., qs], q.detach()[..., qs, :],
                                           k.detach()[..., ks, :], v.detach()[..., ks, :], lse[..., qs], diagonal)
        grads[0][..., qs, :] += gq
        grads[1][..., ks, :] += gk
        grads[2][..., ks, :] += gv
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
