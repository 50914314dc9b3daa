"""A unit's gradients are reduce_scattered where autograd left them: no rank-major copy-in; a padded copy
only of a gradient whose rows N does not divide (minidist/fsdp/reduce_scatter.py)."""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist import comm
from minidist.fsdp import FSDP


def body_inputs_as_they_lie() -> dict:
    torch.manual_seed(0)
    model = FSDP(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 5)), wrap={nn.Linear})
    x = torch.randn(4, 16)
    seen = []
    real = comm.reduce_scatter_coalesced

    def spy(outputs, inputs, *args, **kwargs):  # each input: a view of autograd's gradient, or a copy of it
        seen.append([(tuple(i.shape), i._base is not None) for i in inputs])
        return real(outputs, inputs, *args, **kwargs)

    comm.reduce_scatter_coalesced = spy
    try:
        model(x).sum().backward()
    finally:
        comm.reduce_scatter_coalesced = real
    return {"seen": seen, "grads": [p.grad.clone() for p in model.parameters()]}


def test_gradients_are_reduced_where_they_lie(run_dist):
    r0, r1 = run_dist(2, body_inputs_as_they_lie)
    for out in (r0, r1):
        # backward reaches Linear(16, 5) first: 5 rows at N = 2 are padded to 6 (a copy); 16 rows are not
        assert out["seen"] == [[((6 * 16,), False), ((6,), False)], [((16 * 16,), True), ((16,), True)]], out
    # and the sums are right: every rank's rows agree with a plain module's averaged gradients
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 5))
    plain(torch.randn(4, 16)).sum().backward()
    for mine, theirs, p in zip(r0["grads"], r1["grads"], plain.parameters()):
        assert torch.allclose(torch.cat([mine, theirs])[:p.shape[0]], p.grad, atol=1e-6)
