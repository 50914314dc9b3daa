"""Bytes sent per rank in one training step, against the formulas and against the kernel:
full_shard (3 S - S_root) (N-1)/N, shard_grad_op and no_shard (= DDP) 2 S (N-1)/N. S is computed
here from the plain model's shapes, padding rows included (each parameter padded to N ceil(R/N)
rows; no_shard splits nothing, so pads nothing), S_root from the unit kept gathered for backward, the one whose forward ends last (these models' root holds no parameters and so runs no hooks: the last Linear). The trace
(minidist.comm.trace) must equal the formula exactly; the kernel's count of the bytes this process
wrote to gloo's sockets (minidist.comm.kernel_io) must agree within 1% at N = 2 and 4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.comm import kernel_io
from minidist.fsdp import FSDP
from tests.common import MLP
from tests.fsdp.helpers import fsdp2_args


def _padded_bytes(module: nn.Module, n: int) -> int:
    """fp32 bytes of a module's parameters, each padded to a multiple of n rows."""
    return sum(4 * n * -(-p.shape[0] // n) * (p.numel() // p.shape[0]) for p in module.parameters())


def _step_bytes(model_fn, strategy: str, kernel: bool) -> dict:
    torch.manual_seed(0)
    plain = model_fn()
    n = dist.get_world_size()
    g = 1 if strategy == "no_shard" else n  # ranks that split each parameter: its padding unit
    last = [m for m in plain.modules() if isinstance(m, nn.Linear)][-1]  # these models end with a unit's forward
    s, s_last = _padded_bytes(plain, g), _padded_bytes(last, g)
    model = FSDP(plain, wrap={nn.Linear}, **fsdp2_args(strategy))
    x = torch.randn(4, plain[0].in_features)
    model(x).sum().backward()  # warm-up step: order recorded
    with comm.trace() as tr, (kernel_io.written() if kernel else _nothing()) as w:
        model(x).sum().backward()
    formula = (3 * s - s_last if strategy == "full_shard" else 2 * s) * (n - 1) // n
    return {"traced": tr.sent_bytes, "formula": formula, "kernel": w.bytes if kernel else None,
            "calls": {op: int(row["calls"]) for op, row in tr.totals().items()}, "s": s, "s_last": s_last}


class _nothing:
    bytes = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def body_volume(kernel: bool) -> dict:
    # uneven: rows the world does not divide (13, 37, 5, biases), so padding rows travel;
    # big: ~1 MB units (511 rows), so that gloo's message headers are noise for the kernel's count
    uneven = lambda: nn.Sequential(nn.Linear(16, 13), nn.Tanh(), MLP(13, 37, 5))  # noqa: E731
    even = lambda: nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8))  # noqa: E731
    big = lambda: nn.Sequential(nn.Linear(512, 511), nn.Tanh(), nn.Linear(511, 511), nn.Tanh(),  # noqa: E731
                                nn.Linear(511, 509))
    models = {"big": big} if kernel else {"uneven": uneven, "even": even}
    return {(name, strategy): _step_bytes(fn, strategy, kernel) for name, fn in models.items()
            for strategy in ("full_shard", "shard_grad_op", "no_shard")}


def test_bytes_per_step_match_formulas(run_dist):
    for per_rank in run_dist(2, body_volume, False):
        for cfg, r in per_rank.items():
            assert r["traced"] == r["formula"], (cfg, r)
        fs, sgo, ns = (per_rank[("even", s)]["traced"] for s in ("full_shard", "shard_grad_op", "no_shard"))
        # 1.5x DDP, less the backward all_gather of the last unit: its params stay gathered from forward
        assert fs == 1.5 * ns - per_rank[("even", "full_shard")]["s_last"] / 2 and sgo == ns, (fs, sgo, ns)
        assert per_rank[("uneven", "no_shard")]["calls"] == {"all_reduce": 4}, per_rank
        # one all_gather per unit and pass (the last unit's backward one saved), one reduce_scatter per unit
        assert per_rank[("uneven", "full_shard")]["calls"] == {"all_gather": 7, "reduce_scatter": 4}, per_rank
        # padding travels: the uneven model's S exceeds its unpadded bytes
        assert per_rank[("uneven", "full_shard")]["s"] > 4 * sum(
            p.numel() for p in nn.Sequential(nn.Linear(16, 13), MLP(13, 37, 5)).parameters())


@pytest.mark.skipif(not kernel_io.available(), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("world", [2, 4])
def test_kernel_counts_the_formula_bytes(run_dist, world):
    for per_rank in run_dist(world, body_volume, True):
        for cfg, r in per_rank.items():
            assert r["traced"] == r["formula"], (world, cfg, r)
            assert abs(r["kernel"] - r["formula"]) <= 0.01 * r["formula"], (world, cfg, r)
