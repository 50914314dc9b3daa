"""Checkpoints keyed by the whole mesh coordinate: tensor-parallel slices (sharded by hand, as in
test_placement) saved without overwriting each other, the whole model assembled from them and
loaded back at another tp degree; and checkpoints written before the layout record still resume."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import minidist
from minidist import runtime, strategies
from minidist.mesh import DP, TP, ParallelDims, shard_param
from minidist.models import GPT
from minidist.train import train
from minidist.train.checkpoint import MARKER, Checkpointer
from minidist.parallel.parallelize import full_state_dict
from tests.harness import compose_once

SHAPES = {"col.weight": (6, 4), "col.bias": (6,), "row.weight": (3, 6), "row.bias": (3,)}


class TwoLinear(nn.Module):
    """Megatron's MLP pair: col split over tp by output rows, row by input columns (its bias whole)."""

    def __init__(self, tp: int = 1, rank: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        whole = {k: torch.randn(*s, generator=g) for k, s in SHAPES.items()}
        self.col, self.row = nn.Linear(4, 6 // tp), nn.Linear(6 // tp, 3)
        with torch.no_grad():
            self.col.weight.copy_(whole["col.weight"].chunk(tp, 0)[rank])
            self.col.bias.copy_(whole["col.bias"].chunk(tp, 0)[rank])
            self.row.weight.copy_(whole["row.weight"].chunk(tp, 1)[rank])
            self.row.bias.copy_(whole["row.bias"])
        if tp > 1:
            shard_param(self.col.weight, TP, 0)
            shard_param(self.col.bias, TP, 0)
            shard_param(self.row.weight, TP, 1)


def _step(model: TwoLinear, optimizer, tp: int = 1, rank: int = 0) -> None:
    """One AdamW step on a seeded whole gradient, cut like the parameters (AdamW is elementwise)."""
    g = torch.Generator().manual_seed(1)
    grads = {k: torch.randn(*s, generator=g) for k, s in SHAPES.items()}
    cut = {"col.weight": (0,), "col.bias": (0,), "row.weight": (1,)}
    loss = 0
    for name, p in model.named_parameters():  # a backward whose gradient is `grad`: ZeRO's hooks see it
        grad = grads[name]
        loss = loss + (p * (grad.chunk(tp, cut[name][0])[rank] if name in cut and tp > 1 else grad)).sum()
    loss.backward()
    optimizer.step()


def _save_at_tp2(out: str, zero: bool) -> dict:
    topo = runtime.init("gloo")
    layout = ParallelDims.infer(2, tp=2).build("cpu")  # dp 1 x tp 2: both ranks read the same data
    model = TwoLinear(2, layout.coordinate[TP])
    opt = minidist.ShardedOptimizer(list(model.parameters()), torch.optim.AdamW, mesh=layout[DP], lr=0.1) if zero \
        else torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt, 2, layout.coordinate[TP])
    mine = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = "zero1" if zero else "single"  # a plain model: no model engine either way
    ckpt = Checkpointer(Path(out), 2, model, opt, layout, shapes=SHAPES, strategy=strategy)
    d = ckpt.save(1, {"step": 1, "data": {}})
    whole = full_state_dict(model, layout, strategies.get(strategy))
    for p in model.parameters():  # forget, then load back
        p.data.zero_()
    ckpt.load(d)
    restored = all(torch.equal(v, mine[k]) for k, v in model.state_dict().items())
    return {"rank": topo.rank, "whole": whole, "restored": restored, "files": sorted(json.loads(
        (d / MARKER).read_text())["files"]), "record": json.loads((d / MARKER).read_text())["layout"]}


def _load_at_tp1(out: str) -> dict:
    runtime.init("gloo")
    layout = ParallelDims.infer(1).build("cpu")
    model = TwoLinear()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ckpt = Checkpointer(Path(out), 2, model, opt, layout, shapes=SHAPES, strategy="single")
    ckpt.load(ckpt.usable())
    ref = TwoLinear()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    _step(ref, ref_opt)  # the same step on one process, whole tensors
    return {"model": [torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters())],
            "state": [torch.allclose(opt.state[a][k], ref_opt.state[b][k]) for a, b in
                      zip(model.parameters(), ref.parameters()) for k in ("exp_avg", "exp_avg_sq")]}


@pytest.mark.parametrize("zero", [False, True], ids=["plain", "zero1"])
def test_tp_slices_are_saved_apart_and_the_whole_model_assembled(run_dist, tmp_path, zero):
    got = run_dist(2, _save_at_tp2, str(tmp_path), zero)
    ref = TwoLinear()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    _step(ref, ref_opt)
    main = got[0]
    for k, v in ref.state_dict().items():  # the main process holds the whole model, not its slice
        torch.testing.assert_close(main["whole"][k], v, rtol=0, atol=1e-7, msg=k)
    assert got[1]["whole"] == {}
    assert all(g["restored"] for g in got)
    assert main["record"]["dims"] == ["dp", "tp"] and main["record"]["shapes"]["col.weight"] == [6, 4]
    per_rank = ["state_dp0_tp0.pt", "state_dp0_tp1.pt"] + (["shard_dp0_tp0.pt", "shard_dp0_tp1.pt"] if zero else [])
    assert main["files"] == sorted(["model.pt"] + per_rank)  # two ranks that differ only in tp: two files
    if not zero:  # the whole optimizer state, from slices, loads at tp = 1 as if trained there
        back = run_dist(1, _load_at_tp1, str(tmp_path))[0]
        assert all(back["model"]) and all(back["state"]), back


# --------------------------------------------------------------------------------- older checkpoints
TINY = ["experiment=gpt_tiny", "trainer.eval_interval=0", "trainer.log_interval=2", "data.max_bytes=200000",
        "trainer.steps=6", "trainer.ckpt_interval=3", "trainer.batch_size=4"]


def _as_written_before_the_layout_record(d: Path, cfg) -> None:
    """Rewrite a checkpoint the way minidist wrote it before: the optimizer by position, files keyed by
    dp rank, and a COMPLETE manifest without the "layout" entry."""
    complete = json.loads((d / MARKER).read_text())
    files = complete["files"]
    if "model.pt" in files:
        whole = torch.load(d / "model.pt", weights_only=True)
        order = [n for n, _ in GPT(minidist.models.GPTConfig(**{k: v for k, v in cfg.model.items()
                                                                 if k != "name"})).named_parameters()]
        if "optimizer" in whole:
            by_name = whole["optimizer"]
            whole["optimizer"] = {"state": {order.index(n): st for n, st in by_name["state"].items() if n in order},
                                  "param_groups": [dict(g, params=[order.index(n) for n in g["params"]])
                                                   for g in by_name["param_groups"]]}
        torch.save(whole, d / "model.pt")
        data = (d / "model.pt").read_bytes()
        files["model.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert all(n.endswith(("_dp0.pt", "_dp1.pt")) or n == "model.pt" for n in files), files
    (d / MARKER).write_text(json.dumps({"step": complete["step"], "files": files}, indent=1))


def _old_checkpoints(out: str, strategy: str) -> dict:
    topo = runtime.init("gloo")
    base = TINY + [f"out_dir={out}", f"strategy={strategy}"]
    whole = train(compose_once(base + [f"name={strategy}-whole"]), topo)
    cut = compose_once(base + [f"name={strategy}-cut", "trainer.steps=3"])
    train(cut, topo)
    if topo.rank == 0:
        _as_written_before_the_layout_record(Path(out) / f"{strategy}-cut" / "checkpoints" / "step_0000003", cut)
    torch.distributed.barrier()  # the main process rewrote the files
    rest = train(compose_once(base + [f"name={strategy}-cut", "resume=auto"]), topo)
    if topo.rank:
        return {}
    return {k: (rest["model_state"][k] - v).abs().max().item() for k, v in whole["model_state"].items()}


@pytest.mark.parametrize("strategy", ["ddp", "full_shard"])
def test_a_checkpoint_from_before_the_layout_record_resumes(run_dist, tmp_path, strategy):
    diffs = run_dist(2, _old_checkpoints, str(tmp_path), strategy, timeout=240)[0]
    assert max(diffs.values()) == 0.0, diffs  # as if never stopped: the old files load exactly
