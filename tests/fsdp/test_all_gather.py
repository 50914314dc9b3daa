"""A unit's all_gather lands straight in `full`: while it is in flight the unit holds `full` and
nothing else of its size, and once the collective is done `full` already holds every rank's rows,
parameter-major, with no copy-out by the caller (minidist/fsdp/all_gather.py)."""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.fsdp import FSDP, ShardedState
from minidist.fsdp.footprint import live
from tests.common import MLP


def body_lands_in_full() -> dict:
    torch.manual_seed(0)
    plain = MLP(depth=4)
    torch.manual_seed(0)
    model = FSDP(MLP(depth=4), wrap={nn.Linear})
    x = torch.randn(4, 13)
    model(x).sum().backward()  # the first step records the order the default prefetch follows
    seen = {}

    def at_second_layer(*_):  # after unit 2's pre_forward, which prefetched unit 3
        unit = model.units[3]
        seen["state"] = unit.sharded_state
        seen["own buffers"] = len(unit.all_gather.buffers)
        buffers = live(model)["buffers"]
        seen["full counted"] = any(t.untyped_storage().data_ptr() == unit.shards.full.untyped_storage().data_ptr()
                                   for t in buffers)
        seen["live buffers"] = sum(t.untyped_storage().nbytes() > 0 for t in buffers)
        unit.all_gather.wait()  # waits, and copies nothing: the collective placed every row
        seen["landed"] = [torch.equal(fp.unsharded, p) for fp, p in
                          zip(unit.shards.params, plain.layers[2].parameters())]

    handle = model.module.layers[1].register_forward_pre_hook(at_second_layer)
    model(x).sum().backward()
    handle.remove()
    return seen


def test_the_gather_lands_in_full(run_dist):
    for seen in run_dist(2, body_lands_in_full):
        assert seen["state"] is ShardedState.GATHERING, seen
        assert seen["own buffers"] == 0, seen  # fp32 on the CPU: `local` is sent as it is, no output buffer
        assert seen["full counted"] and seen["live buffers"] == 2, seen  # the computing unit's full and this one's
        assert seen["landed"] == [True, True], seen
