"""FSDP and ZeRO-1 refuse, on every rank, a model that differs across ranks, naming the parameter
(instead of gloo's 'Received data size doesn't match expected size' abort or a hang)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import FSDP, ShardedOptimizer


def _different_models(engine: str) -> str:
    width = 8 if dist.get_rank() == 0 else 9   # rank 1 built a wider first layer
    model = nn.Sequential(nn.Linear(4, width), nn.Linear(width, 2))
    with pytest.raises(RuntimeError) as info:
        if engine == "FSDP":
            FSDP(model, wrap={nn.Linear})
        else:
            ShardedOptimizer(list(model.parameters()), torch.optim.SGD, lr=0.1)
    return str(info.value)


@pytest.mark.parametrize("engine", ["FSDP", "ShardedOptimizer"])
def test_engines_refuse_different_models_on_every_rank(run_dist, engine):
    msgs = run_dist(2, _different_models, engine, timeout=60)
    for msg in msgs:
        assert f"{engine}: ranks built different models" in msg and "\n" not in msg, msg
    name = "'0.weight'" if engine == "FSDP" else "'param 0'"   # ZeRO-1 gets parameters without names
    assert f"{name} shape=(8, 4)" in msgs[0] and f"{name} shape=(9, 4)" in msgs[1], msgs
