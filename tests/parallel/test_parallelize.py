"""build_layout and parallelize: each strategy's layout, the sub-mesh its engine is handed by name,
and one-line errors naming the setting whose degree does not fit."""

import pytest
import torch

from minidist import runtime
from minidist.models import Block
from minidist.parallel.parallelize import build_layout, parallelize
from minidist.train.task import make_task
from tests.harness import compose_once

CASES = {"ddp": [], "zero1": [], "full_shard": [], "no_shard": [], "hybrid_shard": ["strategy.shard_size=1"],
         "full_shard tp": ["strategy.tp_size=2"]}


def _layouts() -> dict:
    topo = runtime.init("gloo")
    out = {}
    for name, extra in CASES.items():
        cfg = compose_once(["experiment=gpt_tiny", f"strategy={name.split()[0]}", *extra])
        layout = build_layout(cfg.strategy, topo)
        model = parallelize(make_task(cfg.model).build()[0], layout, cfg.strategy, (Block,))
        group = getattr(model, "shard_group", False)  # FSDP: the ranks that split its parameters
        out[name] = {"names": layout.names, "shape": tuple(layout.mesh.shape), "dp": layout.dp_size,
                     "fsdp": group if group in (False, None) else torch.distributed.get_world_size(group)}
    errors = {}
    for overrides in (["strategy=full_shard", "model.n_head=3", "model.n_embd=48", "strategy.tp_size=3"],
                      ["strategy=hybrid_shard", "strategy.shard_size=3"]):
        with pytest.raises(ValueError) as e:
            build_layout(compose_once(["experiment=gpt_tiny", *overrides]).strategy, topo)
        errors[overrides[-1]] = str(e.value)
    return out | {"errors": errors}


def test_each_strategy_gets_its_layout_and_sub_mesh(run_dist):
    got = run_dist(2, _layouts)[0]
    for name in ("ddp", "zero1", "full_shard"):
        assert (got[name]["names"], got[name]["shape"], got[name]["dp"]) == (("dp",), (2,), 2), (name, got[name])
    assert got["ddp"]["fsdp"] is False and got["full_shard"]["fsdp"] == 2
    for name in ("no_shard", "hybrid_shard"):  # FSDP2's HSDP mesh; shards of one rank: nothing split (no group)
        assert (got[name]["names"], got[name]["shape"], got[name]["dp"]) == (("replicate", "shard"), (2, 1), 2)
        assert got[name]["fsdp"] is None, (name, got[name])
    errors = got["errors"]
    assert (got["full_shard tp"]["names"], got["full_shard tp"]["shape"]) == (("dp", "tp"), (1, 2))
    assert got["full_shard tp"]["fsdp"] == 1  # FSDP spans "dp" only: one rank here, tp takes the other
    assert errors["strategy.tp_size=3"] == "strategy.tp_size=3 must divide the 2 processes of the job; valid: 1, 2"
    assert errors["strategy.shard_size=3"].startswith("strategy.shard_size=3 does not divide the 2 ranks of this job")
    assert "valid sizes: 1, 2" in errors["strategy.shard_size=3"]
