"""DDP features at world 2, each against the single-process run and/or torch's DDP:
tied weights, frozen and unused parameters, BatchNorm buffers, no_sync,
compression and custom comm hooks, and the clear errors (unused without
find_unused_parameters, ranks that built different models)."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minidist import comm
from minidist.ddp import DDP, allreduce_hook, bf16_compress_hook, fp16_compress_hook
from tests.common import MLP, TiedLM, rank_slice, seeded
from tests.ddp.helpers import OPTIMIZERS, batches, max_diff, train, unwrap

STEPS = 3


def _train_lm(model, data, shard):
    opt = OPTIMIZERS["adamw"](model.parameters())
    for idx, tgt in data:
        if shard:
            idx, tgt = rank_slice(idx), rank_slice(tgt)
        opt.zero_grad()
        F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten()).backward()
        opt.step()
    return model


class Branchy(nn.Module):
    """`never` is never used; `rank0_only` only when the flag is set (on rank 0)."""

    def __init__(self):
        super().__init__()
        self.body = MLP()
        self.never = nn.Linear(5, 5)
        self.rank0_only = nn.Linear(5, 5)
        self.use_extra = False

    def forward(self, x):
        y = self.body(x)
        return self.rank0_only(y) if self.use_extra else y


class WithBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.bn, self.l2 = nn.Linear(13, 9), nn.BatchNorm1d(9), nn.Linear(9, 5)

    def forward(self, x):
        return self.l2(torch.tanh(self.bn(self.l1(x))))


def _seeded_model(cls, seed=0):
    torch.manual_seed(seed)
    return cls()


def _features() -> dict:
    rank = dist.get_rank()
    out = {}
    data = batches(STEPS, 12, 13, 5)

    # tied weights: the shared embedding/head weight is bucketed and reduced once
    g = seeded(3)
    lm_data = [(torch.randint(0, 29, (4, 6), generator=g), torch.randint(0, 29, (4, 6), generator=g))
               for _ in range(STEPS)]
    ref = _train_lm(_seeded_model(TiedLM), lm_data, shard=False)
    ours = DDP(_seeded_model(TiedLM, seed=rank))
    out["tied n_params"] = sum(len(b.params) for b in ours.reducer.buckets)
    _train_lm(ours, lm_data, shard=True)
    out["tied vs ref"] = max_diff(ours.module, ref)
    out["tied torch vs ref"] = max_diff(_train_lm(TorchDDP(_seeded_model(TiedLM)), lm_data, True).module, ref)
    with comm.trace() as t:  # one more backward: the tied weight's bytes are sent once
        F.cross_entropy(ours(lm_data[0][0]).flatten(0, 1), lm_data[0][1].flatten()).backward()
    out["tied sent"] = t.sent_bytes
    out["tied S"] = sum(p.numel() * p.element_size() for p in ours.parameters())  # unique parameters

    # a frozen parameter is excluded from the buckets and never changes
    def frozen():
        m = _seeded_model(MLP)
        m.layers[1].weight.requires_grad_(False)
        return m
    ref = train(frozen(), "adamw", data, shard=False)
    ours = train(DDP(frozen()), "adamw", data, shard=True)
    out["frozen vs ref"] = max_diff(ours.module, ref)
    out["frozen bucketed"] = any(p is ours.module.layers[1].weight for b in ours.reducer.buckets for p in b.params)

    # unused parameters with find_unused_parameters=True: equal torch's DDP with the same flag
    def branchy(wrap, **kw):
        m = wrap(_seeded_model(Branchy), **kw)
        unwrap(m).use_extra = rank == 0
        return m
    ours = train(branchy(DDP, find_unused_parameters=True), "adamw", data, shard=True)
    theirs = train(branchy(TorchDDP, find_unused_parameters=True), "adamw", data, shard=True)
    out["unused vs torch"] = max_diff(ours.module, theirs.module)
    out["never-used grad is None"] = ours.module.never.weight.grad is None
    out["rank0_only grad equal"] = bool(torch.equal(ours.module.rank0_only.weight.grad,
                                                    theirs.module.rank0_only.weight.grad))

    # ... and without the flag: a clear error on every rank, after which training still works
    model = DDP(_seeded_model(Branchy))
    try:
        F.mse_loss(model(data[0][0]), data[0][1]).backward()
        out["unused error"] = None
    except RuntimeError as e:
        out["unused error"] = str(e)
    model.module.never.weight.requires_grad_(False)
    ok = DDP(_seeded_model(MLP))
    train(ok, "sgd", data, shard=True)
    out["usable after error"] = True

    # BatchNorm buffers broadcast from rank 0 before every forward: equal torch's DDP, buffers included
    ours = train(DDP(_seeded_model(WithBN, seed=rank)), "sgd", data, shard=True)
    theirs = train(TorchDDP(_seeded_model(WithBN)), "sgd", data, shard=True)
    out["bn vs torch"] = max_diff(ours.module, theirs.module)
    out["bn buffers vs torch"] = max((a - b).abs().max().item() for a, b in
                                     zip(ours.module.buffers(), theirs.module.buffers()))

    # no_sync: 2 micro-batches accumulated locally + 1 synced == the whole batch; no traffic under no_sync
    ref = train(_seeded_model(MLP), "adamw", data, shard=False)
    for view in (False, True):
        model = DDP(_seeded_model(MLP), gradient_as_bucket_view=view)
        train(model, "adamw", data, shard=True, micro=3, no_sync=model.no_sync)
        out[f"no_sync view={view} vs ref"] = max_diff(model.module, ref)
    with comm.trace() as t, model.no_sync():
        F.mse_loss(model(data[0][0]), data[0][1]).backward()
    out["no_sync traffic"] = len(t.records)

    # compression hooks: within a tolerance of the exact run, half the payload bytes
    for name, hook in (("fp16", fp16_compress_hook), ("bf16", bf16_compress_hook)):
        model = DDP(_seeded_model(MLP), comm_hook=hook)
        with comm.trace() as t:
            train(model, "sgd", data, shard=True)
        out[f"{name} vs ref"] = max_diff(model.module, train(_seeded_model(MLP), "sgd", data, shard=False))
        out[f"{name} dtypes"] = sorted({r.dtype for r in t.records if r.op == "all_reduce"})

    # a custom hook registered like torch's register_comm_hook(state, hook)
    calls = []

    def counting_hook(state, bucket):
        calls.append((state, bucket.index(), len(bucket.parameters())))
        return allreduce_hook(None, bucket)
    model = DDP(_seeded_model(MLP), bucket_cap_mb=1e-6)
    model.register_comm_hook("my-state", counting_hook)
    train(model, "sgd", data, shard=True)
    out["custom hook vs ref"] = max_diff(model.module, train(_seeded_model(MLP), "sgd", data, shard=False))
    out["custom hook calls"] = len(calls)
    out["custom hook state"] = {c[0] for c in calls} == {"my-state"}

    # ranks that built different models: an error on every rank naming the parameter
    try:
        DDP(MLP(hidden=37 if rank == 0 else 36))
        out["mismatch error"] = None
    except RuntimeError as e:
        out["mismatch error"] = str(e)
    return out


def test_features(run_dist):
    for rank, r in enumerate(run_dist(2, _features)):
        assert r["tied n_params"] == 3, "the tied weight appears once"
        assert r["tied sent"] == r["tied S"], "2S(N-1)/N = S at N=2, tied weight counted once"
        assert r["tied vs ref"] < 1e-6 and r["tied torch vs ref"] < 1e-6
        assert r["frozen vs ref"] < 1e-6 and not r["frozen bucketed"]
        assert r["unused vs torch"] < 1e-6 and r["never-used grad is None"] and r["rank0_only grad equal"]
        err = r["unused error"]
        assert err is not None and "never.weight" in err and "find_unused_parameters=True" in err, err
        assert "rank0_only" in err and r["usable after error"]
        assert r["bn vs torch"] < 1e-6 and r["bn buffers vs torch"] < 1e-6
        assert r["no_sync view=False vs ref"] < 1e-6 and r["no_sync view=True vs ref"] < 1e-6
        assert r["no_sync traffic"] == 0
        assert r["fp16 vs ref"] < 2e-3 and r["fp16 dtypes"] == ["float16"]
        assert r["bf16 vs ref"] < 2e-2 and r["bf16 dtypes"] == ["bfloat16"]
        assert r["custom hook vs ref"] < 1e-6 and r["custom hook calls"] == 6 * STEPS and r["custom hook state"]
        err = r["mismatch error"]
        assert err is not None and "layers.0.weight" in err and "different models" in err, err
