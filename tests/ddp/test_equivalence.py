"""K optimizer steps of minidist.DDP at world N == one process on the whole batch ==
torch's DistributedDataParallel, for SGD and AdamW, any bucket size, with and
without gradient_as_bucket_view, buckets reduced in place and through their flat
buffer (one backward mixing both), from ranks that started with different weights."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minidist import comm
from minidist.ddp import DDP
from minidist.buckets import reduction as reduction_module
from tests.common import MLP
from tests.ddp.helpers import batches, max_diff, train, unwrap

STEPS = 3
# (bucket_cap_mb, gradient_as_bucket_view, reduction.py constants): one parameter per bucket .. one bucket for
# all; IN_PLACE_MAX_BYTES=4000 reduces the MLP's 6384-byte bucket through its flat buffer and the other in
# place; SEPARATE_MIN_BYTES=1000 all_reduces its two larger weights on their own, the rest packed
LIMIT = dict(IN_PLACE_MAX_BYTES=4000)
SEPARATE = dict(SEPARATE_MIN_BYTES=1000)
CONFIGS = [(1e-6, False, None), (0.002, False, None), (0.002, False, LIMIT), (25, False, None),
           (25, False, SEPARATE), (1000, False, None), (1e-6, True, None), (25, True, None)]


def _equivalence(opt_name: str) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    data = batches(STEPS, 12, 13, 5)
    torch.manual_seed(0)
    ref = train(MLP(), opt_name, data, shard=False)
    out = {}
    for cap, view, constants in CONFIGS:
        torch.manual_seed(100 + rank)  # different weights on every rank: construction must broadcast rank 0's
        net = MLP()
        if rank == 0:
            torch.manual_seed(0)
            net = MLP()
        defaults = {k: getattr(reduction_module, k) for k in constants or {}}
        vars(reduction_module).update(constants or {})
        try:
            model = DDP(net, bucket_cap_mb=cap, gradient_as_bucket_view=view)
            with comm.trace() as t:
                train(model, opt_name, data, shard=True)
        finally:
            vars(reduction_module).update(defaults)
        out[f"minidist cap={cap} view={view} {constants}"] = max_diff(unwrap(model), ref)
        out[f"buckets cap={cap}"] = len(model.reducer.buckets)
        # in place: no flat buffer was ever allocated; through the flat buffer: it was
        out[f"modes cap={cap} view={view} {constants}"] = [
            (b.in_place, b._flat is not None) for b in model.reducer.buckets]
        out[f"all_reduces cap={cap} view={view} {constants}"] = sum(r.op == "all_reduce" for r in t.records)
    torch.manual_seed(0)
    tdp = TorchDDP(MLP())
    train(tdp, opt_name, data, shard=True)
    out["torch"] = max_diff(unwrap(tdp), ref)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_matches_single_process_and_torch_ddp(run_dist, world):
    for opt_name in ("sgd", "adamw"):
        results = run_dist(world, _equivalence, opt_name)
        for rank, res in enumerate(results):
            for key, diff in res.items():
                if key.startswith(("buckets", "modes", "all_reduces")):
                    continue
                assert diff < 1e-6, f"{opt_name} rank {rank} {key}: max |param - reference| = {diff}"
        r0 = results[0]
        assert r0["buckets cap=1e-06"] == 6, "a tiny cap gives one parameter per bucket"
        assert r0["buckets cap=1000"] == 1, "a huge cap (and a model under the 1 MiB first bucket) gives one bucket"
        for cap, view, constants in CONFIGS:
            modes = r0[f"modes cap={cap} view={view} {constants}"]
            want = [(False, True) if view else (True, False)] * len(modes)  # on the CPU, without a view: in place
            if constants is LIMIT:
                want = [(False, True), (True, False)]  # the 6384-byte bucket over the limit, the other under it
            assert modes == want, (cap, view, constants, modes)
        # one bucket at cap=25: one collective per step; with SEPARATE, two weights + the packed rest
        assert r0["all_reduces cap=25 view=False None"] == STEPS
        assert r0[f"all_reduces cap=25 view=False {SEPARATE}"] == 3 * STEPS


class _Swapped(torch.nn.Module):
    """Registered a, b, c but used c, b, a: the ready order differs from reverse registration."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 5)
        self.b = torch.nn.Linear(8, 8)
        self.c = torch.nn.Linear(13, 8)

    def forward(self, x):
        return self.a(torch.tanh(self.b(torch.tanh(self.c(x)))))


def _rebuild_and_trace() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(_Swapped(), bucket_cap_mb=1e-6)
    names = {id(p): n for n, p in model.module.named_parameters()}
    seen: list[str] = []
    for p in model.module.parameters():
        p.register_post_accumulate_grad_hook(lambda p: seen.append(names[id(p)]))
    before = model.reducer.bucket_param_names()
    before_numels = [b.flat.numel() for b in model.reducer.buckets]
    x, y = torch.randn(6, 13), torch.randn(6, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sent, payload, ops = [], [], []
    for step in range(4):
        opt.zero_grad()
        with comm.trace() as t:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        sent.append(t.sent_bytes)
        payload.append(sum(r.payload_bytes for r in t.records if r.op == "all_reduce"))
        ops.append(sorted({r.op for r in t.records}))
        if step == 0:
            first_order = list(seen)
            launched = [r.numel for r in t.records if r.op == "all_reduce"]
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return dict(launched=launched, before_numels=before_numels, before=before, after=model.reducer.bucket_param_names(), first_order=first_order,
                rebuilds=model.reducer.num_rebuilds, sent=sent, payload=payload, ops=ops,
                grad_bytes=grad_bytes, n_buckets=len(model.reducer.buckets), world=world)


@pytest.mark.parametrize("world", [2, 3])
def test_rebuild_once_in_ready_order_and_trace_bytes(run_dist, world):
    results = run_dist(world, _rebuild_and_trace)
    r0 = results[0]
    for r in results:
        assert r["rebuilds"] == 1
        assert [b[0] for b in r["after"]] == r0["first_order"], "rebuilt buckets follow rank 0's ready order"
        assert r["after"] == r0["after"], "every rank builds the same buckets"
        assert r["before"][0][0].startswith("c."), "initial buckets are in reverse registration order"
        assert r["before"] != r["after"]
        # step 0: bucket 0 (c.*) fills last, yet every rank launches the buckets in bucket order
        assert r["launched"] == r["before_numels"]
        assert r["first_order"][0].startswith("a."), "the model is built so that later buckets fill first"
        S, n = r["grad_bytes"], world
        for step in range(4):
            assert r["payload"][step] == S, "each gradient byte is all_reduced exactly once per step"
            # steps 0 and 2+ carry only the all_reduces; step 1 also broadcasts the ready order (rebuild)
            if step != 1:
                assert r["ops"][step] == ["all_reduce"]
                assert abs(r["sent"][step] - 2 * S * (n - 1) / n) <= r["n_buckets"], "ring bytes 2S(N-1)/N"
