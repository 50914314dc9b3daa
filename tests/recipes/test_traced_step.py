"""recipes/traced_step.py: one traced step per engine shows what the pages say it shows.

The moments drawn on the DDP, ZeRO and FSDP pages must be there, in the order the text tells
(an order, which load cannot change), with the collectives each engine must issue; the picture is
drawn from them without error. World 2 on the test pool; the blocks sleep, so the order is real.
"""

from __future__ import annotations

import pytest


def body_traced(engine: str) -> dict:
    import torch
    import torch.distributed as dist

    from recipes import traced_step as ts
    x = torch.randn(16, ts.WIDTH, generator=torch.Generator().manual_seed(dist.get_rank()))
    return ts.traced(engine, x)


def _kinds(raw, kind):
    return [e for e in raw["probes"] if e[0] == kind]


@pytest.mark.parametrize("engine", ["ddp", "zero", "fsdp"])
def test_traced_step_order_and_picture(run_dist, engine, tmp_path):
    from recipes import traced_step as ts
    ranks = run_dist(2, body_traced, engine)
    for raw in ranks:
        (_, f0, f1), (_, b0, b1), (_, o0, _) = raw["phases"]
        ops = [r["op"] for r in raw["records"]]
        launches, callback = _kinds(raw, "launch"), _kinds(raw, "callback")
        assert len(callback) == 1 and b0 <= callback[0][2] and callback[0][3] <= b1 + 1e-3, callback
        if engine in ("ddp", "zero"):
            hooks = _kinds(raw, "hook")
            assert hooks and hooks[0][2] < launches[0][2] < callback[0][2], (hooks[:1], launches[:1])
            # the first bucket travels while every block's backward is still to run: overlap, by order
            assert ts._left(raw, launches[0][2]) == ts.BLOCKS
            assert [lbl for _, lbl, _, _ in launches] == [f"bucket {k}" for k in range(len(launches))]
        if engine == "ddp":
            assert set(ops) == {"all_reduce"}
        if engine == "zero":  # reduce_scatter per bucket in backward, all_gather per bucket after step()
            n = len(launches)
            assert ops == ["reduce_scatter"] * n + ["all_gather"] * n, ops
            assert all(r["issued"] >= o0 for r in raw["records"] if r["op"] == "all_gather")
        if engine == "fsdp":
            gathers = _kinds(raw, "gather")
            fwd = [lbl for _, lbl, t, _ in gathers if t < f1]
            bwd = [lbl for _, lbl, t, _ in gathers if b0 <= t < b1]
            assert fwd == ["root"] + [f"blocks.{k}" for k in range(ts.BLOCKS)], fwd
            assert bwd == [f"blocks.{k}" for k in reversed(range(ts.BLOCKS))], bwd  # the root is kept
            assert [lbl for _, lbl, _, _ in launches][-1] == "root" and len(launches) == ts.BLOCKS + 1
            assert ops.count("all_gather") == 2 * ts.BLOCKS + 1 and ops.count("reduce_scatter") == ts.BLOCKS + 1
            # prefetch: block k's gather is issued before block k-1 starts computing (an order)
            sleeps = [a for ph, a, _ in raw["compute"] if ph == "forward"]
            assert all(gathers[1 + k][2] < sleeps[k - 1] for k in range(1, ts.BLOCKS)), (gathers, sleeps)
    moments = ts.MOMENTS[engine](ranks[0])
    assert [t for t, _, _ in moments] == sorted(t for t, _, _ in moments) or engine == "fsdp"
    path = ts.draw_step(ranks, tmp_path / f"step_{engine}.png", ts.TITLES[engine], moments)
    assert path.stat().st_size > 10_000
