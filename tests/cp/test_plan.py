"""parallelize_gpt's refusals, one line each naming what is wrong and how to fix it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from minidist import cp
from minidist.cp import CPPolicy
from minidist.models.gpt import GPT, GPTConfig
from tests.cp.helpers import CFG, cp_mesh


def _error(call) -> str:
    with pytest.raises(ValueError) as e:
        call()
    return str(e.value)


def body_refusals() -> list[str]:
    mesh, model = cp_mesh(), GPT(GPTConfig(**CFG))
    tp_named = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    once = cp.parallelize_gpt(GPT(GPTConfig(**CFG)), mesh)
    return [_error(lambda: cp.parallelize_gpt(GPT(GPTConfig(**{**CFG, "dropout": 0.1})), mesh)),
            _error(lambda: cp.parallelize_gpt(GPT(GPTConfig(**{**CFG, "block_size": 30})), mesh)),
            _error(lambda: cp.parallelize_gpt(model, tp_named)),
            _error(lambda: cp.parallelize_gpt(once, mesh)),
            _error(lambda: once(torch.zeros(1, 24, dtype=torch.long))),  # 24 tokens per rank: 48 > block_size
            _error(lambda: cp.shard_batch(torch.zeros(1, 30, dtype=torch.long), None, mesh)),
            _error(lambda: CPPolicy.of("zig-zag", prefix="strategy.cp_"))]


def test_every_refusal_is_one_line(run_dist):
    msgs = run_dist(2, body_refusals)[0]
    assert all("\n" not in m for m in msgs), msgs
    dropout, block, mesh, twice, long, cut, policy = msgs
    assert dropout.startswith("cp=2: context parallelism runs without dropout") and "set dropout=0" in dropout
    assert block == "cp=2 must split block_size=30 into 4 chunks (zigzag); valid: 1, 3, 5, 15"
    assert "one mesh dimension named 'cp', got dimensions ('tp',); pass mesh['cp']" in mesh
    assert "already context-parallel" in twice
    assert long == "a sequence of 48 tokens (24 per rank x cp=2) exceeds block_size=32"
    assert cut.startswith("a sequence of 30 tokens does not split into 4 equal chunks (zigzag chunking at cp=2)")
    assert policy == "strategy.cp_chunking='zig-zag' is not one of contiguous, zigzag"
