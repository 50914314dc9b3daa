"""Bytes sent per rank in one training step (minidist.comm.trace), against the formulas:
full_shard (3 S - S_last) (N-1)/N, shard_grad_op and no_shard (= DDP) 2 S (N-1)/N, S = padded
bytes, S_last = those of the unit that ends the forward (kept gathered for backward)."""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist import comm
from minidist.fsdp import FSDP
from tests.common import MLP
from tests.fsdp.helpers import make_opt


def _step_bytes(model_fn, strategy: str, wrap) -> tuple[int, int, int, dict]:
    torch.manual_seed(0)
    model = FSDP(model_fn(), wrap=wrap, sharding_strategy=strategy)
    opt = make_opt(model.parameters())
    x = torch.randn(4, 16)
    model(x).sum().backward()  # warm-up step: order recorded
    opt.step()
    opt.zero_grad()
    with comm.trace() as tr:
        model(x).sum().backward()
        opt.step()
    s = sum(u.shards.padded * 4 for u in model.units)  # S: fp32 bytes of the padded flat buffers
    s_last = model._schedule.post_forward_order[-1].shards.padded * 4  # these models end with a unit's forward
    return tr.sent_bytes, s, s_last, {op: int(row["calls"]) for op, row in tr.totals().items()}


def body_volume() -> dict:
    n = torch.distributed.get_world_size()
    out = {}
    uneven = lambda: nn.Sequential(nn.Linear(16, 13), nn.Tanh(), MLP(13, 37, 5))  # noqa: E731
    even = lambda: nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8))  # noqa: E731
    for name, fn in (("uneven", uneven), ("even", even)):
        for strategy in ("full_shard", "shard_grad_op", "no_shard"):
            sent, s, s_last, calls = _step_bytes(fn, strategy, {nn.Linear})
            volume = 3 * s - s_last if strategy == "full_shard" else 2 * s
            out[(name, strategy)] = (sent, volume * (n - 1) // n, calls)
        out[(name, "s_last")] = s_last
    return out


def test_bytes_per_step_match_formulas(run_dist):
    for per_rank in run_dist(2, body_volume):
        for cfg, (sent, expected, calls) in ((k, v) for k, v in per_rank.items() if k[1] != "s_last"):
            assert sent == expected, (cfg, sent, expected, calls)
        fs, sgo, ns = (per_rank[("even", s)][0] for s in ("full_shard", "shard_grad_op", "no_shard"))
        # 1.5x DDP, less the backward all_gather of the last unit: its params stay gathered from forward
        assert fs == 1.5 * ns - per_rank[("even", "s_last")] / 2 and sgo == ns, (fs, sgo, ns)  # (N-1)/N = 1/2
        assert per_rank[("uneven", "no_shard")][2] == {"all_reduce": 4}, per_rank
        assert per_rank[("uneven", "full_shard")][2] == {"all_gather": 7, "reduce_scatter": 4}, per_rank
