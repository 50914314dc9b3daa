"""Each DDP step of the track equals one process on the whole batch, with the collectives it promises."""

import copy

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.tutorial.ddp_bucketed import BucketedDDP, assign_buckets
from minidist.tutorial.ddp_flat import FlatDDP
from minidist.tutorial.ddp_naive import NaiveDDP
from minidist.tutorial.ddp_overlap import OverlapDDP
from tests.common import MLP, rank_slice, seeded

STEPS = {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP,
         "bucketed": lambda m: BucketedDDP(m, bucket_size_mb=0.004)}  # 4 KiB: several buckets
K = 3


def _train(step: str):
    torch.manual_seed(0)
    reference = MLP()
    torch.manual_seed(dist.get_rank())  # replicas start different: the wrapper must broadcast rank 0's
    model = STEPS[step](MLP())
    x, y = torch.randn(8, 13, generator=seeded(1)), torch.randn(8, 5, generator=seeded(2))
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = copy.deepcopy(reference.state_dict())
    calls = []
    for _ in range(K):
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt_ref.step()
        opt_ref.zero_grad()
        with comm.trace() as t:
            torch.nn.functional.mse_loss(model(rank_slice(x)), rank_slice(y)).backward()
            model.finish_gradient_synchronization()
        calls.append(len([r for r in t.records if r.op == "all_reduce"]))
        opt.step()
        opt.zero_grad()
    err = max((a - b).abs().max().item() for a, b in zip(model.module.parameters(), reference.parameters()))
    moved = min((p - start[n]).abs().max().item() for n, p in reference.named_parameters())
    return err, moved, calls


@pytest.mark.parametrize("step", list(STEPS))
def test_step_equals_one_process(run_dist, step):
    n_params = len(list(MLP().parameters()))
    expected_calls = {"naive": n_params, "flat": 1, "overlap": n_params,
                      "bucketed": len(assign_buckets(list(MLP().parameters()), 0.004 * 2**20))}[step]
    for err, moved, calls in run_dist(2, _train, step):
        assert moved > 1e-4, "training did not change the parameters: the comparison would prove nothing"
        assert err < 1e-6, f"{step}: {err:.2e} from one process on the whole batch"
        assert calls == [expected_calls] * K, f"{step}: all_reduces per step {calls}, expected {expected_calls}"


def test_buckets_are_reverse_order_and_capped():
    params = [torch.zeros(100), torch.zeros(300), torch.zeros(50), torch.zeros(1000)]  # 400, 1200, 200, 4000 B
    buckets = assign_buckets(params, 1500)
    assert [[p.numel() for p in b] for b in buckets] == [[1000], [50, 300], [100]]
    assert 1 < len(assign_buckets(list(MLP().parameters()), 0.004 * 2**20)) < len(list(MLP().parameters()))
