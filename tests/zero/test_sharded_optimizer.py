"""ZeRO-1: ShardedOptimizer + minidist.DDP over K AdamW steps == the plain optimizer in one
process; each rank keeps state for its share only; state_dict round trip; lr schedulers work;
a sharded_state_dict saved at world 2 resumes at world 1 and 3 as if never interrupted."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from minidist.ddp import DDP
from minidist.zero import ShardedOptimizer, partition_by_numel
from tests.common import MLP, rank_slice
from tests.ddp.helpers import batches, max_diff

STEPS = 3


def _groups(model):
    """Two param groups with different hyperparameters: weights decay, biases do not."""
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.1},
            {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0, "lr": 0.02}]


def _run(model, opt, data, shard, sched=None):
    for x, y in data:
        if shard:
            x, y = rank_slice(x), rank_slice(y)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def _zero1() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    data = batches(STEPS + 2, 12, 13, 5)
    out = {}

    def fresh():
        torch.manual_seed(0)
        return MLP(hidden=41, depth=4)

    # K AdamW steps (two param groups, a LR schedule) == the plain optimizer in one process
    ref = fresh()
    ref_opt = torch.optim.AdamW(_groups(ref), lr=0.01)
    _run(ref, ref_opt, data[:STEPS], False, torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5))
    model = DDP(fresh())
    opt = ShardedOptimizer(_groups(model.module), torch.optim.AdamW, lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    _run(model, opt, data[:STEPS], True, sched)
    out["vs ref"] = max_diff(model.module, ref)
    opt.zero_grad()
    opt.step()  # no grads: updates nothing, but hands the scheduler's latest lr to the inner optimizer
    out["inner lr"] = [g["lr"] for g in opt.optim.param_groups]
    out["ref lr"] = [g["lr"] for g in ref_opt.param_groups]

    # state only for this rank's share
    owned = opt.owned_parameters()
    out["owned ids"] = sorted(i for i, p in enumerate(model.parameters()) if any(p is q for q in owned))
    out["owned numel"] = sum(p.numel() for p in owned)
    out["state numel"] = sum(v.numel() for s in opt.state.values() for k, v in s.items() if k != "step")
    out["state keys"] = len(opt.state)

    # state_dict round trip: save, continue 2 steps; reload into a fresh copy, same 2 steps -> same params
    saved_sd = copy.deepcopy(opt.state_dict())  # as if written to disk: state_dict holds live tensors
    saved_params = [p.detach().clone() for p in model.parameters()]
    _run(model, opt, data[STEPS:], True)
    twin = DDP(fresh())
    with torch.no_grad():
        for p, q in zip(twin.parameters(), saved_params):
            p.copy_(q)
    twin_opt = ShardedOptimizer(_groups(twin.module), torch.optim.AdamW, lr=0.01)
    twin_opt.load_state_dict(saved_sd)
    _run(twin, twin_opt, data[STEPS:], True)
    out["round trip"] = max_diff(twin.module, model.module)
    try:
        twin_opt.load_state_dict(dict(saved_sd, world_size=world + 1))
        out["bad load"] = None
    except ValueError as e:
        out["bad load"] = str(e)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_zero1_matches_plain_optimizer(run_dist, world):
    results = run_dist(world, _zero1)
    n_params = 8
    owned = sorted(i for r in results for i in r["owned ids"])
    assert owned == list(range(n_params)), "every parameter is owned by exactly one rank"
    total = sum(r["owned numel"] for r in results)
    for r in results:
        assert r["vs ref"] < 1e-6, r["vs ref"]
        assert r["inner lr"] == r["ref lr"], "the scheduler's lr reaches the inner optimizer"
        assert r["state numel"] == 2 * r["owned numel"], "AdamW state (exp_avg, exp_avg_sq) for the share only"
        assert r["state keys"] == len(r["owned ids"])
        assert r["owned numel"] < total, "no rank holds all the state"
        assert r["round trip"] < 1e-6
        assert r["bad load"] is not None and f"of {world + 1}" in r["bad load"]


def _fresh_mlp():
    torch.manual_seed(0)
    return MLP(hidden=41, depth=4)


def _save_sharded() -> dict:
    """STEPS steps at this world size; every rank returns its sharded_state_dict and the parameters."""
    model = DDP(_fresh_mlp())
    opt = ShardedOptimizer(_groups(model.module), torch.optim.AdamW, lr=0.01)
    _run(model, opt, batches(STEPS + 2, 12, 13, 5)[:STEPS], True)
    return {"shard": opt.sharded_state_dict(), "params": [p.detach().clone() for p in model.parameters()]}


def _resume_sharded(shards: list[dict], params: list[torch.Tensor]) -> dict:
    """Load every saved rank's shard at this (other) world size, take 2 more steps, compare."""
    data = batches(STEPS + 2, 12, 13, 5)
    ref = _fresh_mlp()
    ref_opt = torch.optim.AdamW(_groups(ref), lr=0.01)
    _run(ref, ref_opt, data, False)
    model = DDP(_fresh_mlp())
    with torch.no_grad():
        for p, q in zip(model.parameters(), params):
            p.copy_(q)
    opt = ShardedOptimizer(_groups(model.module), torch.optim.AdamW, lr=0.01)
    out = {}
    try:
        opt.load_sharded_state_dict(shards[:1])
    except ValueError as e:
        out["partial load"] = str(e)
    opt.load_sharded_state_dict(shards)
    out["state numel"] = sum(v.numel() for s in opt.state.values() for k, v in s.items() if k != "step")
    out["owned numel"] = sum(p.numel() for p in opt.owned_parameters())
    _run(model, opt, data[STEPS:], True)
    out["vs ref"] = max_diff(model.module, ref)
    return out


def test_sharded_state_dict_resumes_at_another_world_size(run_dist):
    saved = run_dist(2, _save_sharded)
    shards = [r["shard"] for r in saved]
    assert shards[0]["state"].keys().isdisjoint(shards[1]["state"].keys()), "each rank saves its own share"
    for world in (1, 3):
        for r in run_dist(world, _resume_sharded, shards, saved[0]["params"]):
            assert r["vs ref"] < 1e-6, (world, r["vs ref"])
            assert r["state numel"] == 2 * r["owned numel"], "only this rank's share is kept"
            assert "all 2 saved ranks" in r["partial load"], r["partial load"]


def test_partition_is_balanced_and_deterministic():
    params = [torch.empty(n) for n in (533, 41, 1681, 41, 1681, 41, 205, 5)]
    owner = partition_by_numel(params, 3)
    assert owner == partition_by_numel(params, 3)
    loads = [sum(p.numel() for p, o in zip(params, owner) if o == r) for r in range(3)]
    assert max(loads) - min(loads) <= max(p.numel() for p in params)
    assert set(owner) == {0, 1, 2}
