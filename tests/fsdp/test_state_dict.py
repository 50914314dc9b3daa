"""State dicts: the full one loads into the plain module (tied names included), loads back
(every rank or rank 0 + broadcast), and sharded checkpoints written at world 2 reload at
world 2, 3 and 4 with their optimizer state, continuing training as if never interrupted.
Sharded format 2 holds each rank's rows of every parameter; format 1 (the flat-parameter
FSDP's, files in tests/fsdp/data) still loads; a format this code does not know is refused
in one line."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from minidist.fsdp import FSDP
from tests.common import rank_slice
from tests.fsdp.helpers import WRAPS, loss_of, make_batches, make_model, make_opt, max_diff

KIND = "gpt"


def _fsdp(seed: int = 0) -> FSDP:
    return FSDP(make_model(KIND, seed), wrap=WRAPS[KIND])


def _step(model: FSDP, opt, batch) -> None:
    x, y = batch
    opt.zero_grad()
    loss_of(KIND, model, rank_slice(x), rank_slice(y)).backward()
    opt.step()


def body_save() -> dict:
    batches = make_batches(KIND)
    model = _fsdp()
    opt = make_opt(model.parameters())
    for b in batches[:2]:
        _step(model, opt, b)
    full0 = model.full_state_dict()  # rank0_only, cpu
    full = model.full_state_dict(rank0_only=False)
    shards = model.sharded_state_dict(opt)
    # round trips at the same world size: full (every rank), full (rank 0 + broadcast), sharded
    trips = {}
    for how in ("full", "rank0"):
        other = _fsdp(seed=7)
        if how == "full":
            other.load_full_state_dict(full)
        elif how == "rank0":
            other.load_full_state_dict(full0 if dist.get_rank() == 0 else None, broadcast_from_rank0=True)
        trips[how] = max_diff(other.full_state_dict(rank0_only=False), full)
    try:
        _fsdp().load_sharded_state_dict([shards])  # one rank's dict cannot rebuild the model
        trips["refused"] = False
    except ValueError as e:
        trips["refused"] = "all 2 saved ranks" in str(e)
    try:
        _fsdp().load_sharded_state_dict([shards | {"format_version": 9}])
        trips["future"] = "no error"
    except ValueError as e:
        trips["future"] = str(e)
    _step(model, opt, batches[2])
    return {"full0": full0, "shards": shards, "trips": trips,
            "after": model.full_state_dict(rank0_only=False)}


def body_load(all_shards: list[dict]) -> dict:
    model = _fsdp(seed=7)
    opt = make_opt(model.parameters())
    model.load_sharded_state_dict(all_shards, opt)
    loaded = model.full_state_dict(rank0_only=False)
    _step(model, opt, make_batches(KIND)[2])
    return {"loaded": loaded, "after": model.full_state_dict(rank0_only=False)}


def test_state_dicts_and_resharding(run_dist):
    saved = run_dist(2, body_save)
    full0 = saved[0]["full0"]
    assert saved[1]["full0"] == {}, "rank0_only: other ranks get nothing"
    # the plain module loads it, tied weights included
    plain = make_model(KIND, seed=3)
    plain.load_state_dict(full0)
    assert plain.lm_head.weight is plain.wte.weight
    assert max_diff(plain.state_dict(), full0) == 0.0
    for r in saved:
        assert r["trips"]["full"] == 0.0 and r["trips"]["rank0"] == 0.0 and r["trips"]["refused"], r["trips"]
        assert "format [9]" in r["trips"]["future"] and "\n" not in r["trips"]["future"], r["trips"]
    shards = [r["shards"] for r in saved]
    # format 2: rank r's rows of each parameter, with its trailing dimensions
    for sd in shards:
        assert sd["format_version"] == 2
        for fqn, entry in sd["params"].items():
            rows, shape = entry["shard"].shape, entry["global_shape"]
            c = -(-(shape[0] if shape else 1) // 2)
            assert tuple(rows[1:]) == tuple(shape[1:]) and rows[0] <= c and entry["row_offset"] == min(sd["rank"] * c, shape[0]), (fqn, rows, shape)
            assert torch.equal(entry["shard"], full0[fqn][entry["row_offset"]:entry["row_offset"] + rows[0]]), fqn
    for world in (2, 3, 4):
        for r in run_dist(world, body_load, shards):
            assert max_diff(r["loaded"], full0) == 0.0, world
            # optimizer state resharded too: the next step matches the uninterrupted run
            assert max_diff(r["after"], saved[0]["after"]) < 1e-6, (world, max_diff(r["after"], saved[0]["after"]))


DATA = Path(__file__).parent / "data"


def body_load_v1() -> dict:
    shards = [torch.load(DATA / f"flat_v1_rank{r}.pt", weights_only=True) for r in range(2)]
    return body_load(shards)


def test_format1_checkpoints_load(run_dist):
    """Written by the flat-parameter FSDP (world 2): loads at world 2 and 3, and trains on as that engine did."""
    expected = torch.load(DATA / "flat_v1_expected.pt", weights_only=True)
    for world in (2, 3):
        for r in run_dist(world, body_load_v1):
            assert max_diff(r["loaded"], expected["full"]) == 0.0, world
            assert max_diff(r["after"], expected["after_next_step"]) < 1e-6, world
