"""ZeRO equals one process on the whole batch: ShardedOptimizer (stage 1, stage 2, owner-broadcast)
with any elementwise torch optimizer, parameter groups, an lr scheduler, gradient clipping, several
buckets, gradient accumulation (no_sync, and synced backwards that accumulate), tied weights and
add_param_group after construction, at N = 2 and N = 4."""

import pytest
import torch
import torch.distributed as dist

from minidist.zero import ShardedOptimizer
from tests.common import TiedLM, rank_slice, seeded
from tests.ddp.helpers import batches
from tests.zero.helpers import fresh_mlp, max_diff, train, two_groups

STEPS = 3
VARIANTS = {"zero1": dict(stage=1), "zero2": dict(stage=2), "owner": dict(owner_broadcast=True)}


def _reference(data, opt_fn, micro_data=None, clip=None, sched=False):
    ref = fresh_mlp()
    opt = opt_fn(two_groups(ref))
    s = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5) if sched else None
    norms = train(ref, opt, data, shard=False, sched=s, clip=clip)
    return ref, norms


def _adamw(groups, **kw):
    return torch.optim.AdamW(groups, lr=0.01, **kw)


def _equivalence() -> dict:
    data = batches(STEPS, 12, 13, 5)
    out = {}
    ref, ref_norms = _reference(data, _adamw, clip=0.5, sched=True)
    for name, kw in VARIANTS.items():  # groups, scheduler, clipping, buckets of ~1 KiB (several per group)
        model = fresh_mlp()
        opt = ShardedOptimizer(two_groups(model), torch.optim.AdamW, lr=0.01, bucket_cap_mb=0.001, **kw)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
        norms = train(model, opt, data, shard=True, sched=sched, clip=0.5)
        out[name] = max_diff(model, ref)
        out[name + " norms"] = max(abs(a - b) for a, b in zip(norms, ref_norms))
        out[name + " lr"] = [g["lr"] for g in opt.param_groups] == [0.01 * 0.5 ** STEPS, 0.02 * 0.5 ** STEPS]
    out["grads after backward"] = [p.grad for p in model.parameters()].count(None)  # owner: whole grads

    sgd = lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True)  # noqa: E731
    ref, _ = _reference(data, sgd)
    for stage in (1, 2):  # accumulation: under no_sync, and with every backward synced
        for sync_every in (False, True):
            model = fresh_mlp()
            opt = ShardedOptimizer(two_groups(model), torch.optim.SGD, lr=0.1, momentum=0.9, nesterov=True,
                                   bucket_cap_mb=0.002, stage=stage)
            train(model, opt, data, shard=True, micro=3, sync_every_micro=sync_every)
            out[f"sgd accumulate stage {stage} sync_every={sync_every}"] = max_diff(model, ref)

    # add_param_group after construction (CS336's tests call it): biases join after the first step
    ref = fresh_mlp()
    ref_opt = torch.optim.Adagrad(two_groups(ref)[:1], lr=0.05)
    model = fresh_mlp()
    opt = ShardedOptimizer(two_groups(model)[:1], torch.optim.Adagrad, lr=0.05, stage=2)
    for i, (x, y) in enumerate(data):
        if i == 1:
            ref_opt.add_param_group(two_groups(ref)[1])
            opt.add_param_group(two_groups(model)[1])
        ref.zero_grad()
        model.zero_grad()
        train(ref, ref_opt, [(x, y)], shard=False)
        train(model, opt, [(x, y)], shard=True)
    out["add_param_group"] = max_diff(model, ref)

    # tied weights: one parameter, two uses, one gradient
    g = seeded(3)
    tokens = [torch.randint(0, 29, (8, 5), generator=g) for _ in range(STEPS)]
    models = {}
    for name in ("ref", "zero2"):
        torch.manual_seed(0)
        lm = TiedLM()
        opt = (torch.optim.AdamW(lm.parameters(), lr=0.01) if name == "ref" else
               ShardedOptimizer(lm.parameters(), torch.optim.AdamW, lr=0.01, stage=2))
        for t in tokens:
            t = t if name == "ref" else rank_slice(t)
            opt.zero_grad()
            lm(t).float().logsumexp(-1).mean().backward()
            opt.step()
        models[name] = lm
    out["tied"] = max_diff(models["zero2"], models["ref"])
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_optimizer_equals_one_process(run_dist, world):
    for r in run_dist(world, _equivalence, timeout=240):
        for key, value in r.items():
            if key.endswith(" lr"):
                assert value, "the scheduler's lr reaches the wrapped optimizer"
            elif key == "grads after backward":
                assert value == 0, "owner-broadcast keeps DDP's whole averaged gradients in p.grad"
            else:
                assert value < 2e-6, (world, key, value)


def _partitions() -> dict:
    """Stage 1 vs 2 vs owner: what each rank holds after a synced backward."""
    torch.manual_seed(0)
    out = {}
    for name, kw in VARIANTS.items():
        model = fresh_mlp()
        opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01, **kw)
        x = torch.randn(4, 13, generator=seeded(dist.get_rank()))
        model(x).square().mean().backward()
        opt.step()
        local = [t for g in opt.param_groups for t in g["params"]]
        psi = sum(p.numel() for p in model.parameters())
        out[name] = {"psi": psi, "p.grad None": all(p.grad is None for p in model.parameters()),
                     "state": sum(v.numel() for s in opt.state.values() for k, v in s.items() if k != "step"),
                     "local": sum(t.numel() for t in local),
                     "grad buffers": sum(b.grad_flat.numel() for b in getattr(opt.engine, "buckets", [])
                                         if b.grad_flat is not None)}
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_holds_its_partition(run_dist, world):
    results = run_dist(world, _partitions)
    for r in results:
        for name in ("zero1", "zero2"):
            psi, local = r[name]["psi"], r[name]["local"]
            assert local == -(-psi // world), "equal slices: ceil(psi / N) elements per rank"
            assert r[name]["state"] == 2 * local, "AdamW's two moments for the partition only"
            assert r[name]["p.grad None"], "the gradient lives in the buckets, not in p.grad"
        assert r["zero1"]["grad buffers"] >= r["zero1"]["psi"], "ZeRO-1 keeps the whole gradient buffer"
        assert r["zero2"]["grad buffers"] == 0, "ZeRO-2 frees every bucket's gradient once reduce_scattered"
        assert not r["owner"]["p.grad None"]
    owner_shares = [r["owner"]["local"] for r in results]
    assert sum(owner_shares) == results[0]["owner"]["psi"], "every whole parameter has one owner"


def _refuses_ddp() -> str:
    from minidist.ddp import DDP
    model = DDP(fresh_mlp())
    with pytest.raises(ValueError) as info:
        ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01)
    return str(info.value)


def test_refuses_a_ddp_wrapped_model(run_dist):
    for msg in run_dist(2, _refuses_ddp):
        assert "not of a minidist.DDP wrapper" in msg and "\n" not in msg
