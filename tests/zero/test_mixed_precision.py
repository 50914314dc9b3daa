"""ZeRO under a MixedPrecisionPolicy: bf16/fp16 parameters and compute, fp32 master partitions, gradients
reduced in reduce_dtype. K steps stay within a stated tolerance of an fp32 run in one process; the
paper's layout holds (2-byte parameters and gradients, 12 bytes per partition element); an fp16 sum
that would overflow at N = 4 does not, thanks to the pre/post division; and with fp16 loss scaling
(torch's ShardedGradScaler) an inf on one rank makes every rank skip the step.""" 

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from minidist import comm
from minidist.precision import MixedPrecisionPolicy
from minidist.zero import ShardedOptimizer
from tests.ddp.helpers import batches
from tests.zero.helpers import fresh_mlp, max_diff, train

STEPS = 3
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
"""max |parameter - fp32 one-process reference| after 3 SGD steps (lr 0.1, momentum 0.9): a few units in
the last place of the low-precision copy (bf16: 2^-8 relative, fp16: 2^-11) on weights of size ~0.1-1.
SGD, not Adam, for this comparison: Adam's first steps move every weight by about lr whatever its
gradient's size, so a near-zero gradient whose sign the rounding flips moves it 2 lr the other way."""


def _sgd(ps, **kw):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9, **kw)


def _vs_fp32() -> dict:
    data = batches(STEPS, 12, 13, 5)
    ref = fresh_mlp()
    train(ref, _sgd(ref.parameters()), data, shard=False)
    out = {}
    for stage in (1, 2):
        for pd, rd in ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float16, torch.float16)):
            policy = MixedPrecisionPolicy(param_dtype=pd, reduce_dtype=rd)
            model = fresh_mlp()
            opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, stage=stage,
                                   bucket_cap_mb=0.002, mp_policy=policy, module=model)
            train(model, opt, data, shard=True)  # float32 batches: the module's inputs are cast to pd
            out[(stage, pd, rd)] = {"diff": max_diff(model, ref),
                                    "param dtype": {p.dtype for p in model.parameters()} == {pd}}
            model = fresh_mlp()  # the memory layout, with AdamW (K = 12)
            opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01, stage=stage, bucket_cap_mb=0.002,
                                   mp_policy=policy, module=model)
            train(model, opt, data[:1], shard=True)
            masters = [t for g in opt.param_groups for t in g["params"]]
            buckets = opt.engine.buckets
            out[(stage, pd, rd)] |= {
                "param bytes": sum(b.flat_param.element_size() * b.flat_param.numel() for b in buckets),
                "grad bytes": sum(b.grad_flat.element_size() * b.grad_flat.numel() for b in buckets
                                  if b.grad_flat is not None),
                "padded": sum(b.shards.padded_numel for b in buckets),
                "master + state bytes": sum(t.numel() * 4 for t in masters) + sum(
                    v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items() if k != "step"),
                "local": sum(t.numel() for t in masters), "master dtype": {t.dtype for t in masters}}
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_mixed_precision_close_to_fp32_with_the_papers_layout(run_dist, world):
    for r in run_dist(world, _vs_fp32, timeout=180):
        for (stage, pd, rd), m in r.items():
            assert m["diff"] < TOLERANCE[pd], (stage, pd, rd, m["diff"])
            assert m["param dtype"] and m["master dtype"] == {torch.float32}
            assert m["param bytes"] == 2 * m["padded"], "2-byte parameters on every rank"
            if stage == 1:
                assert m["grad bytes"] == rd.itemsize * m["padded"], "ZeRO-1: the whole gradient, in reduce_dtype"
            else:
                assert m["grad bytes"] == 0, "ZeRO-2: no whole gradient after backward"
            assert m["master + state bytes"] == 12 * m["local"], "12 bytes per element of the partition"
            assert m["local"] * world == m["padded"]


def _overflow() -> dict:
    """Every rank's gradient is 30000: their fp16 sum at N = 4 (120000) exceeds fp16's 65504."""
    world = dist.get_world_size()
    control = torch.full((8,), 30000.0, dtype=torch.float16)
    comm.all_reduce(control)
    w = nn.Parameter(torch.ones(8))
    opt = ShardedOptimizer([w], torch.optim.SGD, lr=1e-6,
                           mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float16))
    (w * 30000.0).sum().backward()
    grad = [t.grad.clone() for g in opt.param_groups for t in g["params"]]
    opt.step()
    return {"control": bool(torch.isinf(control).any()), "world": world, "grad": grad[0][:2].tolist(),
            "w": w.float().tolist(), "pre_post": (opt.engine.buckets[0].pre_divide, opt.engine.buckets[0].post_divide)}


def test_fp16_reduction_does_not_overflow(run_dist):
    for r in run_dist(4, _overflow):
        assert r["control"], "a plain fp16 sum of the four gradients overflows"
        assert r["pre_post"] == (2.0, 2.0)
        assert r["grad"] == [30000.0, 30000.0], "the average, finite"
        assert max(abs(x - (1 - 1e-6 * 30000)) for x in r["w"]) < 1e-3


def _scaler_agrees() -> dict:
    rank = dist.get_rank()
    model = fresh_mlp()
    opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, stage=2,
                           mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16), module=model)
    scaler = ShardedGradScaler("cpu", init_scale=1024.0, process_group=opt.process_group)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(2, 13)).float().square().mean()
    if rank == 1:
        loss = loss + model.layers[0].weight[0, 0].float() * float("inf")  # one element, one rank
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    skipped = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    x = torch.ones(2, 13)
    opt.zero_grad()
    scaler.scale(model(x).float().square().mean()).backward()
    scaler.step(opt)
    scaler.update()
    return {"skipped": skipped, "scale": scaler.get_scale(),
            "stepped": not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))}


def test_sharded_grad_scaler_skips_on_every_rank(run_dist):
    for r in run_dist(2, _scaler_agrees):
        assert r["skipped"], "the rank whose partition is finite skips too"
        assert r["scale"] == 512.0 and r["stepped"]
