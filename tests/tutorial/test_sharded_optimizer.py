"""The track's ShardedOptimizer equals the plain optimizer, keeps 1/N of the state, and grows with add_param_group."""

import torch
import torch.distributed as dist

from minidist.tutorial.ddp_flat import FlatDDP
from minidist.tutorial.sharded_optimizer import ShardedOptimizer
from tests.common import MLP, rank_slice, seeded

K = 4


def _groups(model):
    first, *rest = model.layers
    later = [p for layer in rest for p in layer.parameters()]
    return [{"params": list(first.parameters()), "lr": 0.01}], later


def _train():
    torch.manual_seed(0)
    reference = MLP()
    torch.manual_seed(0)
    model = FlatDDP(MLP())
    x, y = torch.randn(8, 13, generator=seeded(1)), torch.randn(8, 5, generator=seeded(2))
    opts = []
    for m, make in ((reference, torch.optim.AdamW),
                    (model.module, lambda g, **kw: ShardedOptimizer(g, torch.optim.AdamW, **kw))):
        groups, later = _groups(m)
        opt = make(groups, lr=0.02, weight_decay=0.1)
        opt.add_param_group({"params": later, "lr": 0.03})   # after construction, as CS336's test does
        opts.append((opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)))
    for _ in range(K):
        torch.nn.functional.mse_loss(reference(x), y).backward()
        torch.nn.functional.mse_loss(model(rank_slice(x)), rank_slice(y)).backward()
        model.finish_gradient_synchronization()
        for opt, sched in opts:
            opt.step()
            opt.zero_grad()
            sched.step()  # halves lr after 2 steps: the last step ran at half the start lr
    sharded = opts[1][0]
    err = max((a - b).abs().max().item() for a, b in zip(model.module.parameters(), reference.parameters()))
    owned = {i for i, p in enumerate(model.module.parameters()) if p in sharded.local.state}
    inner_lrs = [g["lr"] for g in sharded.local.param_groups]
    return err, owned, inner_lrs, sum(p.numel() for p in model.module.parameters())


def test_sharded_optimizer_equals_adamw_and_shards_its_state(run_dist):
    results = run_dist(2, _train)
    n_params = len(list(MLP().parameters()))
    owned = [o for _, o, _, _ in results]
    for err, _, inner_lrs, _ in results:
        assert err < 1e-6, f"{err:.2e} from torch.optim.AdamW"
        assert inner_lrs == [0.005, 0.015], f"the scheduler's lr did not reach the wrapped optimizer: {inner_lrs}"
    assert owned[0] and owned[1] and not owned[0] & owned[1], "each parameter's state lives on one rank"
    assert owned[0] | owned[1] == set(range(n_params)), "every parameter's state lives somewhere"


def _state_bytes():
    torch.manual_seed(0)
    model = MLP(d_in=64, hidden=64, depth=4)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    mine = sum(t.numel() * t.element_size() for s in opt.local.state.values() for t in s.values() if t.dim())
    return mine, dist.get_world_size(), sum(p.numel() for p in model.parameters())


def test_each_rank_keeps_about_one_nth_of_the_state(run_dist):
    largest = max(p.numel() for p in MLP(d_in=64, hidden=64, depth=4).parameters())
    for mine, world, numel in run_dist(2, _state_bytes):
        full = 8 * numel  # AdamW: exp_avg and exp_avg_sq, fp32
        # least-loaded-first keeps every rank within one parameter of the mean
        assert abs(mine - full / world) <= 8 * largest, (mine, full)
        assert mine < 0.75 * full, (mine, full)
