"""The shared launcher (minidist.buckets.launcher): order, hooks, end-of-backward callback. One process."""

import gc

import torch
import torch.nn as nn

from minidist.buckets.launcher import OrderedLauncher, hook_gradients, is_reduced, mark_reduced, queue_end_of_backward


def test_buckets_launch_in_order_as_they_fill():
    full, launched = set(), []
    launcher = OrderedLauncher(lambda b: b in full, launched.append)
    launcher.buckets += ["b0", "b1", "b2"]
    full.add("b1")
    launcher.launch_ready()
    assert launched == [] and launcher.unlaunched == ["b0", "b1", "b2"]  # b1 waits for b0
    full.add("b0")
    launcher.launch_ready()
    assert launched == ["b0", "b1"] and launcher.unlaunched == ["b2"]
    launcher.launch_ready()
    assert launched == ["b0", "b1"], "a launched bucket is never launched again"
    full.add("b2")
    launcher.launch_ready()
    assert launched == ["b0", "b1", "b2"] and launcher.unlaunched == []
    launcher.reset()
    assert launcher.unlaunched == ["b0", "b1", "b2"]


class _Engine:
    def __init__(self, params):
        self.events = []
        self.handles = hook_gradients(self, params, ["w", "b"], _Engine.on_gradient)

    def on_gradient(self, key, param):
        if not self.events:
            queue_end_of_backward(lambda: self.events.append("end"))
        self.events.append((key, param.grad is not None))


def test_hooks_fire_after_accumulation_and_the_callback_after_every_hook():
    lin = nn.Linear(3, 2)
    engine = _Engine([lin.weight, lin.bias])
    lin(torch.ones(4, 3)).sum().backward()
    assert sorted(engine.events[:2]) == [("b", True), ("w", True)] and engine.events[2:] == ["end"]


def test_hooks_hold_their_engine_weakly():
    lin = nn.Linear(3, 2)
    engine = _Engine([lin.weight, lin.bias])
    events = engine.events
    del engine
    gc.collect()
    lin(torch.ones(4, 3)).sum().backward()  # the engine is gone: its hooks do nothing, and nothing raises
    assert events == [] and lin.weight.grad is not None


def test_mark_reduced():
    p, q = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    mark_reduced([p])
    assert is_reduced(p) and not is_reduced(q)
