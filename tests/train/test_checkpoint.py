"""Checkpoints that cannot silently rot, resume at another number of processes, and name a mismatched model."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from minidist import runtime
from minidist.train import train
from minidist.train.checkpoint import CheckpointError
from tests.harness import compose_once

TINY = ["experiment=gpt_tiny", "trainer.eval_interval=0", "trainer.log_interval=2", "data.max_bytes=200000",
        "trainer.sample_bytes=0", "logger.mode=disabled", "trainer.progress_bar=false", "trainer.keep_last=2"]


def _run(overrides: list[str]) -> dict:
    return train(compose_once(TINY + overrides), runtime.init("gloo"))


def _flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _corruptions(out: str) -> dict:
    base = [f"out_dir={out}", "name=rot", "strategy=single", "trainer.ckpt_interval=2"]
    _run(base + ["trainer.steps=6"])
    ckpts = Path(out) / "rot" / "checkpoints"
    manifest = json.loads((ckpts / "step_0000006" / "COMPLETE").read_text())
    _flip_bit(ckpts / "step_0000006" / "model.pt")
    err, log = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(log):
        _run(base + ["trainer.steps=8", "resume=auto"])   # skips step 6, resumes from step 4
    (ckpts / "step_0000008" / "model.pt").write_bytes(b"\0" * 1000)  # zero-filled
    (ckpts / "step_0000006" / "state_dp0.pt").write_bytes(b"")       # truncated, and model.pt still flipped
    with pytest.raises(CheckpointError) as none_good:
        _run(base + ["trainer.steps=10", "resume=auto"])
    return {"files": sorted(manifest["files"]), "stderr": err.getvalue(), "stdout": log.getvalue(),
            "none_good": str(none_good.value)}


def test_corrupted_checkpoints_are_named_and_skipped(run_dist, tmp_path):
    got = run_dist(1, _corruptions, str(tmp_path), timeout=180)[0]
    assert got["files"] == ["model.pt", "state_dp0.pt"]
    warning = [ln for ln in got["stderr"].splitlines() if "step_0000006" in ln]
    assert len(warning) == 1 and "model.pt: checksum mismatch" in warning[0], got["stderr"]
    assert "resumed from step 4" in got["stdout"], got["stdout"]
    msg = got["none_good"]
    assert "\n" not in msg and "no checkpoint" in msg and "weights_only" not in msg, msg
    assert "step_0000008: model.pt: 1000 bytes" in msg and "step_0000006:" in msg, msg


def _mismatch(out: str, strategy: str) -> dict:
    base = [f"out_dir={out}", f"strategy={strategy}", "trainer.ckpt_interval=2"]
    _run(base + [f"name=mm-{strategy}", "trainer.steps=2"])
    with pytest.raises(runtime.UsageError) as relaunch:  # the run's own config names the keys
        _run(base + [f"name=mm-{strategy}", "trainer.steps=4", "resume=auto", "model.n_embd=24"])
    with pytest.raises(CheckpointError) as explicit:  # a checkpoint named outright: its parameters say it
        _run(base + [f"name=other-{strategy}", "trainer.steps=4", "model.n_embd=24",
                     f"resume={out}/mm-{strategy}/checkpoints/step_0000002"])
    return {"relaunch": str(relaunch.value), "explicit": str(explicit.value),
            "usage": isinstance(explicit.value, runtime.UsageError)}


@pytest.mark.parametrize("strategy", ["ddp", "full_shard"])
def test_changed_model_names_the_first_differing_parameters(run_dist, tmp_path, strategy):
    got = run_dist(2, _mismatch, str(tmp_path), strategy, timeout=180)
    assert got[0] == got[1]  # the same lines on every rank
    line = got[0]["relaunch"]
    assert "holds a run of another model: model.n_embd=24 (the run's: 32); its weights cannot load" in line, line
    line = got[0]["explicit"]
    assert "does not match the configured model" in line and "\n" not in line and got[0]["usage"], line
    assert "'blocks.0.attn.proj.bias' (32,) in the checkpoint vs (24,) in the model" in line, line


ELASTIC = ["trainer.steps=8", "trainer.ckpt_interval=4", "trainer.keep_last=4"]


def _at_two(out: str, strategy: str) -> dict:
    whole = _run([f"out_dir={out}", f"name={strategy}-whole", f"strategy={strategy}", "trainer.batch_size=4"]
                 + ELASTIC)
    _run([f"out_dir={out}", f"name={strategy}-cut", f"strategy={strategy}", "trainer.batch_size=4",
          "trainer.steps=4", "trainer.ckpt_interval=4"])
    return whole.get("model_state")


def _at_one(out: str, strategy: str) -> dict:
    # the same global batch (2 x 4 = 1 x 8), continued from the 2-process checkpoint by one process
    return _run([f"out_dir={out}", f"name={strategy}-cut", f"strategy={strategy}", "trainer.batch_size=8",
                 "resume=auto"] + ELASTIC)["model_state"]


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "full_shard"])
def test_checkpoint_of_two_processes_resumes_at_one(run_dist, tmp_path, strategy):
    whole = run_dist(2, _at_two, str(tmp_path), strategy, timeout=180)[0]
    resumed = run_dist(1, _at_one, str(tmp_path), strategy, timeout=180)[0]
    for k in whole:
        torch.testing.assert_close(resumed[k], whole[k], atol=1e-5, rtol=0, msg=k)


def _sigterm_on_rank1_after(step: int):
    def callback(run, done: int) -> None:
        if done == step and run.topo.rank == 1:
            import os
            import signal
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would, to one process only
    return callback


def _preempt(out: str) -> dict:
    base = TINY + [f"out_dir={out}", "strategy=ddp", "trainer.steps=8"]
    topo = runtime.init("gloo")
    whole = train(compose_once(base + ["name=whole"]), topo)
    first = train(compose_once(base + ["name=cut"]), topo, [_sigterm_on_rank1_after(3)])
    marker = (Path(out) / "cut" / "PREEMPTED").read_text() if topo.rank == 0 else None
    rest = train(compose_once(base + ["name=cut", "resume=auto"]), topo)
    diff = max((whole["model_state"][k] - rest["model_state"][k]).abs().max().item()
               for k in whole["model_state"]) if topo.rank == 0 else None
    return {"first": first, "marker": marker, "diff": diff,
            "marker_after_resume": (Path(out) / "cut" / "PREEMPTED").exists()}


def test_sigterm_on_one_rank_stops_every_rank_after_the_same_step(run_dist, tmp_path):
    got = run_dist(2, _preempt, str(tmp_path), timeout=180)
    for g in got:  # the vote launched before step 4 carries rank 1's flag: both stop after step 4
        assert g["first"]["preempted"] and g["first"]["step"] == 4, g["first"]
    assert got[0]["marker"] == "4\n" and not got[0]["marker_after_resume"]
    assert got[0]["diff"] == 0.0  # nothing lost: bitwise equal to the uninterrupted run
