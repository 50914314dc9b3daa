"""The track's FSDP: equal to one process in fp32, close in bf16, with sharded storage and its collectives."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.tutorial.fsdp import FSDP
from tests.common import rank_slice, seeded

K = 3


class Net(nn.Module):
    """Embedding, Linear, LayerNorm: 29 and 11 rows do not split evenly over 2 or 4 ranks."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(29, 12)
        self.mid = nn.Linear(12, 11)
        self.norm = nn.LayerNorm(11)
        self.head = nn.Linear(11, 29)

    def forward(self, idx):
        return self.head(self.norm(torch.tanh(self.mid(self.emb(idx)))))


def _loss(logits, targets):
    return nn.functional.cross_entropy(logits.float().reshape(-1, 29), targets.reshape(-1))


def _data():
    return torch.randint(0, 29, (8, 5), generator=seeded(1)), torch.randint(0, 29, (8, 5), generator=seeded(2))


def _fp32():
    torch.manual_seed(0)
    reference = Net()
    torch.manual_seed(dist.get_rank())  # rank 0 = the reference; the wrapper must start every rank from rank 0's values
    model = FSDP(Net())
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    idx, targets = _data()
    freed_after_forward = True
    for _ in range(K):
        _loss(reference(idx), targets).backward()
        opt_ref.step()
        opt_ref.zero_grad()
        with comm.trace() as t:
            logits = model(rank_slice(idx))
            freed_after_forward &= all(sp.full.untyped_storage().size() == 0 for sp in model.params.values())
            _loss(logits, rank_slice(targets)).backward()
            model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
    full = model.gather_full_params()
    err = max((full[n] - p).abs().max().item() for n, p in reference.named_parameters())
    shapes = {n: tuple(p.shape) for n, p in model.module.named_parameters()}
    calls = {op: sum(r.op == op for r in t.records) for op in ("all_gather", "reduce_scatter")}
    return err, shapes, calls, freed_after_forward, sorted(full) == sorted(dict(reference.named_parameters()))


@pytest.mark.parametrize("world", [2, 4])  # 4: uneven pieces, rank 3 holds 2 of 11 rows
def test_fsdp_fp32_equals_one_process(run_dist, world):
    results = run_dist(world, _fp32)
    n_params = len(list(Net().parameters()))
    for err, _, calls, freed, same_names in results:
        assert same_names
        assert err < 1e-5, f"{err:.2e} from one process on the whole batch"
        assert freed, "the full parameters must be freed after each unit's forward"
        assert calls == {"all_gather": 2 * n_params, "reduce_scatter": n_params}, calls  # forward, backward
    for name, p in Net().named_parameters():  # each rank holds its rows along dim 0; together, all of them
        rows = [shapes[name][0] for _, shapes, _, _, _ in results]
        assert sum(rows) == p.shape[0] and max(rows) == -(-p.shape[0] // world), (name, rows)
        assert all(shapes[name][1:] == tuple(p.shape[1:]) for _, shapes, _, _, _ in results)


def _bf16():
    torch.manual_seed(0)
    reference = Net()
    model = FSDP(copy.deepcopy(reference), compute_dtype=torch.bfloat16)
    idx, targets = _data()
    _loss(reference(idx), targets).backward()
    with comm.trace() as t:
        _loss(model(rank_slice(idx)), rank_slice(targets)).backward()
        model.finish_gradient_synchronization()
    dtypes = {(r.op, r.dtype) for r in t.records}
    grads = {n: sp.shard.grad for n, sp in model.params.items()}
    rank, k = dist.get_rank(), {n: -(-p.shape[0] // 2) for n, p in reference.named_parameters()}
    errs = {n: ((grads[n] - p.grad[rank * k[n]:(rank + 1) * k[n]]).abs().max() / p.grad.abs().max()).item()
            for n, p in reference.named_parameters()}
    master = {p.dtype for p in model.parameters()} | {g.dtype for g in grads.values()}
    return dtypes, errs, master


def test_fsdp_bf16_gathers_in_bf16_reduces_in_fp32_and_keeps_fp32_masters(run_dist):
    for dtypes, errs, master in run_dist(2, _bf16):
        assert dtypes == {("all_gather", "bfloat16"), ("reduce_scatter", "float32")}, dtypes
        assert master == {torch.float32}, master
        assert max(errs.values()) < 0.05, f"bf16 gradients too far from fp32 ones (relative): {errs}"
