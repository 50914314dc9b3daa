"""Checkpoints: state_dict() round trip at the same world size (and a clear refusal elsewhere);
sharded_state_dict() saved at N = 2 resumes at 1 and 4, and at another bucket size and across the
two variants, as if never interrupted."""

import copy

import pytest
import torch

from minidist.zero import ShardedOptimizer
from tests.ddp.helpers import batches
from tests.zero.helpers import fresh_mlp, max_diff, train, two_groups

STEPS = 3
DATA = batches(STEPS + 2, 12, 13, 5)


def _opt(model, **kw):
    return ShardedOptimizer(two_groups(model), torch.optim.AdamW, lr=0.01, **kw)


def _round_trip() -> dict:
    model = fresh_mlp()
    opt = _opt(model, stage=2, bucket_cap_mb=0.002)
    train(model, opt, DATA[:STEPS], shard=True)
    saved = copy.deepcopy(opt.state_dict())  # as if written to disk: state_dict holds live tensors
    params = [p.detach().clone() for p in model.parameters()]
    train(model, opt, DATA[STEPS:], shard=True)
    twin = fresh_mlp()
    twin_opt = _opt(twin, stage=2, bucket_cap_mb=0.002)
    with torch.no_grad():
        for p, q in zip(twin.parameters(), params):
            p.copy_(q)
    twin_opt.load_state_dict(saved)
    train(twin, twin_opt, DATA[STEPS:], shard=True)
    out = {"round trip": max_diff(twin, model)}
    for bad, kw in (("other world", dict(saved, world_size=saved["world_size"] + 1)),
                    ("other layout", saved)):
        try:
            _opt(fresh_mlp(), stage=2, bucket_cap_mb=1.0 if bad == "other layout" else 0.002).load_state_dict(kw)
            out[bad] = None
        except ValueError as e:
            out[bad] = str(e)
    return out


@pytest.mark.parametrize("world", [2])
def test_state_dict_round_trip(run_dist, world):
    for r in run_dist(world, _round_trip):
        assert r["round trip"] < 1e-7
        assert "sharded_state_dict() resumes at any" in r["other world"]
        assert "the shards differ" in r["other layout"]


def _save(kw: dict) -> dict:
    model = fresh_mlp()
    opt = _opt(model, **kw)
    train(model, opt, DATA[:STEPS], shard=True)
    return {"shard": opt.sharded_state_dict(), "params": [p.detach().clone() for p in model.parameters()]}


def _resume(shards: list[dict], params: list[torch.Tensor], kw: dict) -> dict:
    ref = fresh_mlp()
    train(ref, torch.optim.AdamW(two_groups(ref), lr=0.01), DATA, shard=False)
    model = fresh_mlp()
    with torch.no_grad():
        for p, q in zip(model.parameters(), params):
            p.copy_(q)
    opt = _opt(model, **kw)
    out = {}
    try:
        opt.load_sharded_state_dict(shards[:1])
    except ValueError as e:
        out["partial load"] = str(e)
    opt.load_sharded_state_dict(shards)
    local = sum(t.numel() for g in opt.param_groups for t in g["params"])
    out["state numel == 2 x local"] = sum(v.numel() for s in opt.state.values() for k, v in s.items()
                                          if k != "step") == 2 * local
    train(model, opt, DATA[STEPS:], shard=True)
    out["vs ref"] = max_diff(model, ref)
    return out


def test_sharded_state_dict_resumes_at_another_world_size_and_layout(run_dist):
    saved = run_dist(2, _save, dict(stage=1, bucket_cap_mb=0.002))
    shards = [r["shard"] for r in saved]
    assert shards[0]["state"].keys() != shards[1]["state"].keys(), "each rank saves its own pieces"
    for world, kw in ((1, dict(stage=1)), (4, dict(stage=2, bucket_cap_mb=0.001)),
                      (4, dict(owner_broadcast=True))):
        for r in run_dist(world, _resume, shards, saved[0]["params"], kw):
            assert r["vs ref"] < 2e-6, (world, kw, r["vs ref"])
            assert r["state numel == 2 x local"], "only this rank's partition is kept"
            assert "all 2 saved ranks" in r["partial load"], r["partial load"]
    saved = run_dist(2, _save, dict(owner_broadcast=True))  # and from the variant to the flat partitions
    for r in run_dist(2, _resume, [s["shard"] for s in saved], saved[0]["params"], dict(stage=2)):
        assert r["vs ref"] < 2e-6, r["vs ref"]
