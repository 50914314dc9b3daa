"""K AdamW steps of FSDP at world N == one process on the whole batch (fp32, 1e-6)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from minidist.fsdp import FSDP, hybrid_groups
from tests.fsdp.helpers import WRAPS, make_batches, make_model, max_diff, reference, train

TOL = 1e-6


def _run(kind: str, wrap: bool, **fsdp_kwargs) -> float:
    model = FSDP(make_model(kind), wrap=WRAPS[kind] if wrap else None, **fsdp_kwargs)
    train(kind, model, make_batches(kind), shard=True)
    return max_diff(model.full_state_dict(rank0_only=False), reference(kind, dist.get_world_size()))


def body_full_shard(kinds: list[str]) -> dict:
    return {(kind, wrap): _run(kind, wrap) for kind in kinds for wrap in (False, True)}


@pytest.mark.parametrize("world", [2, 3])
def test_full_shard_matches_single_process(run_dist, world):
    results = run_dist(world, body_full_shard, ["mlp", "tied", "gpt", "twice"])
    for per_rank in results:
        for cfg, diff in per_rank.items():
            assert diff < TOL, f"{cfg}: max |fsdp - reference| = {diff}"
