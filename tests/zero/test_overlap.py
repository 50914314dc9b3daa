"""overlap_param_gather: step() returns with the all_gathers in flight and each module waits for its
buckets in a forward pre-hook; the result is the same as without overlap (== one process)."""

import torch
import torch.distributed as dist

from minidist.zero import ShardedOptimizer
from minidist.zero.bucket import ParamState
from tests.ddp.helpers import batches
from tests.zero.helpers import fresh_mlp, max_diff, train, two_groups


def _overlap() -> dict:
    data = batches(3, 12, 13, 5)
    ref = fresh_mlp()
    train(ref, torch.optim.AdamW(two_groups(ref), lr=0.01), data, shard=False)
    out = {}
    for stage in (1, 2):
        model = fresh_mlp()
        opt = ShardedOptimizer(two_groups(model), torch.optim.AdamW, lr=0.01, stage=stage, bucket_cap_mb=0.002,
                               module=model, overlap_param_gather=True)
        order = []
        for i, layer in enumerate(model.layers):  # which buckets are still gathering when each layer starts
            layer.register_forward_pre_hook(lambda m, a, i=i: order.append(
                (i, [b.param_state is ParamState.GATHERING for b in opt.engine.buckets])), prepend=False)
        train(model, opt, data, shard=True)
        out[f"stage {stage} in flight after step"] = sum(b.param_state is ParamState.GATHERING
                                                         for b in opt.engine.buckets)
        opt.wait_for_params()
        out[f"stage {stage}"] = max_diff(model, ref)
        layer_buckets = [[b.index for b in opt.engine.buckets if any(p is q for p in b.params for q in l.parameters())]
                         for l in model.layers]
        out[f"stage {stage} waited"] = all(not state[b] for i, state in order for b in layer_buckets[i])
    return out


def test_overlapped_gather_waits_before_use_and_changes_nothing(run_dist):
    for r in run_dist(2, _overlap):
        for stage in (1, 2):
            assert r[f"stage {stage}"] < 2e-6, r
            assert r[f"stage {stage} in flight after step"] > 0, "step() returns before the parameters arrive"
            assert r[f"stage {stage} waited"], "every layer's buckets are complete when its forward starts"
