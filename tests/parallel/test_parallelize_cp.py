"""Context parallelism inside every data-parallel engine, built as the trainer builds it (strategy.cp_size=2
composed, build_layout, parallelize, build_optimizer, local_batch, clip_grad_norm_, full_state_dict), at 4
processes: dp 2 x cp 2 for each engine (hybrid_shard's and no_shard's 2-D mesh with the cp ranks joined
to its shard or replicate dimension: minidist.mesh.Layout.hybrid_dims), and cp 2 x tp 2 (dp 1). K steps
equal one process on the whole batch: losses (the mean over every cp rank's tokens), clipped global
gradient norms and the whole model, fp32, 1e-5 (tests.parallel.test_parallelize_tp's reference, batches and checks). The clip threshold is
below the norm, so a gradient summed over cp twice, or not reduced over cp at all, changes every update.
The chunkings, rotations and activation checkpointing are spread over the engines, each run once."""

from __future__ import annotations

import pytest

from tests.parallel.test_parallelize_tp import _compose_and_train, assert_equals_one_process

TP2 = ["strategy.tp_size=2"]
CASES = {
    "ddp": [],
    "zero1 +contiguous": ["strategy.cp_chunking=contiguous"],
    "zero2 +all_gather": ["strategy.cp_rotate=all_gather"],
    "zero1_broadcast": [],
    "shard_grad_op +contiguous all_gather": ["strategy.cp_chunking=contiguous", "strategy.cp_rotate=all_gather"],
    "full_shard +checkpointing": ["model.activation_checkpointing=true"],
    "hybrid_shard (replicate 2 x shard_cp 2)": ["strategy.shard_size=1"],
    "no_shard (replicate_cp 4)": [],
    "ddp x tp2": TP2,
    "full_shard x tp2 +sp +vocab": TP2 + ["strategy.sequence_parallel=true", "strategy.vocab_parallel=true"],
}


@pytest.fixture(scope="module")
def composed(_pools):
    return _pools.run(4, _compose_and_train, CASES, ("strategy.cp_size=2",), timeout=400)


@pytest.mark.parametrize("case", list(CASES))
def test_cp_inside_each_engine_equals_one_process(composed, case):
    assert all("ContextParallelAttention" in r[case]["modules"] for r in composed), "the sequence was not split"
    main = assert_equals_one_process(composed, case)
    hybrid = case.split()[0] in ("hybrid_shard", "no_shard")  # FSDP2's 2-D mesh, cp joined to one dimension
    assert main["mesh"] == ({"dp": 1, "cp": 2, "tp": 2} if "tp2" in case else
                            {"replicate": 2, "shard": 1, "cp": 2} if hybrid else {"dp": 2, "cp": 2})
    if hybrid:  # hybrid_shard shards over shard x cp (replicated over "replicate"); no_shard shards nothing
        assert main["split_over"] == (["shard_cp"] if case.startswith("hybrid") else []), main["split_over"]
