"""The split backward: BI then BW leave exactly the gradients of one backward, BI computes no weight
gradient, and BW does not run the input path again (counted by autograd functions on each path)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from minidist.pp import split_gpt
from minidist.pp.backward import backward_input, backward_weight
from tests.pp.helpers import gpt


class _Count(torch.autograd.Function):
    """Identity that counts its backward calls in `log[name]`."""

    @staticmethod
    def forward(ctx, x, log, name):
        ctx.log, ctx.name = log, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.log[ctx.name] = ctx.log.get(ctx.name, 0) + 1
        return grad, None, None


class _Counted(nn.Module):
    def __init__(self, log: dict):
        super().__init__()
        self.lin, self.log = nn.Linear(6, 6), log

    def forward(self, x):
        w = _Count.apply(self.lin.weight, self.log, "weight path")
        return torch.tanh(F.linear(_Count.apply(x, self.log, "input path"), w, self.lin.bias))


def test_each_half_runs_only_its_own_path():
    log: dict = {}
    layer = _Counted(log)
    x = torch.randn(3, 6, requires_grad=True)
    pending = backward_input(layer(x), torch.ones(3, 6), x, list(layer.parameters()))
    assert x.grad is not None and layer.lin.weight.grad is None and layer.lin.bias.grad is None
    assert log == {"input path": 1}
    backward_weight(pending)
    assert log == {"input path": 1, "weight path": 1}, "BW ran the input path again"
    assert layer.lin.weight.grad is not None and layer.lin.bias.grad is not None


def test_the_halves_add_up_to_one_backward_on_every_gpt_stage():
    cut = split_gpt(gpt(4), 3)
    targets = torch.randint(0, 31, (2, 16))
    for s, module in enumerate(cut.modules):
        if s == 2:  # the last stage's head weight is the first stage's embedding: start it clean
            for p in module.parameters():
                p.grad = None
        ref = copy.deepcopy(module)
        if s == 0:
            x = x_ref = torch.randint(0, 31, (2, 16))
        else:
            x = torch.randn(2, 16, 18, requires_grad=True)
            x_ref = x.detach().clone().requires_grad_()
        out, out_ref = module(x), ref(x_ref)
        grad = None if s == 2 else torch.randn_like(out)
        if s == 2:
            out, out_ref = cut.loss_fn(out, targets), cut.loss_fn(out_ref, targets)
        torch.autograd.backward(out_ref, grad)
        pending = backward_input(out, grad, x, list(module.parameters()))
        assert all(p.grad is None for p in module.parameters()), f"stage {s}: BI computed weight gradients"
        backward_weight(pending)
        if s > 0:
            assert torch.equal(x.grad, x_ref.grad)
        for (name, p), q in zip(module.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), (s, name)


def test_a_weight_used_twice_gets_its_gradient_with_the_input():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 5)

        def forward(self, x):
            return self.a(torch.tanh(self.b(self.a(x))))

    torch.manual_seed(0)
    net, ref = Twice(), None
    ref = copy.deepcopy(net)
    x = torch.randn(3, 5, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    g = torch.randn(3, 5)
    ref(x_ref).backward(g)
    pending = backward_input(net(x), g, x, list(net.parameters()))
    assert net.a.weight.grad is not None and net.b.weight.grad is None  # a: two uses, computed in BI
    backward_weight(pending)
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-7)
