"""metrics.jsonl is strict JSON and reads as one run; wandb follows its own environment variables."""

import json
from pathlib import Path

import pytest

from minidist.cli.compose import compose_config
from minidist.train.metrics import RunLogger, keep_rows_up_to, read_metrics, wandb_settings


def _strict(line: str):
    return json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))


@pytest.fixture(scope="module")
def cfg():
    return compose_config(["experiment=gpt_tiny"])  # logger.mode=disabled, no progress bar


def test_non_finite_values_are_written_as_null(cfg, tmp_path):
    log = RunLogger(tmp_path, cfg, 0, 10, {}, "t")
    log.log({"step": 1, "train/loss": 2.5, "train/grad_norm": float("nan"), "x": float("inf"), "y": -float("inf")})
    log.close()
    row = _strict((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row == {"step": 1, "train/loss": 2.5, "train/grad_norm": None, "x": None, "y": None}


def test_a_resumed_run_drops_the_rows_it_redoes(cfg, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "train/loss": 1.0}) + "\n" for s in (2, 4, 6)) + '{"step": 8, "tr')
    keep_rows_up_to(path, 4)  # resumed from the checkpoint at step 4; 6 and the cut-off line go
    assert [r["step"] for r in read_metrics(path)] == [2, 4]
    log = RunLogger(tmp_path, cfg, 2, 10, {}, "t")  # the logger does it when it opens the file
    log.close()
    assert [r["step"] for r in read_metrics(path)] == [2]


@pytest.mark.parametrize("env,config,want", [
    ({}, {}, ("offline", "minidist", "RUN")),
    ({"WANDB_MODE": "disabled", "WANDB_PROJECT": "p", "WANDB_DIR": "/w"}, {}, ("disabled", "p", "/w")),
    ({"WANDB_MODE": "dryrun"}, {}, ("offline", "minidist", "RUN")),
    ({"WANDB_MODE": "disabled", "WANDB_PROJECT": "p", "WANDB_DIR": "/w"},
     {"logger.mode": "online", "logger.project": "mine", "logger.dir": "/d"}, ("online", "mine", "/d")),
])
def test_wandb_follows_its_environment_unless_the_config_says(monkeypatch, env, config, want):
    for key in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    c = compose_config([f"{k}={v}" for k, v in config.items()])
    got = wandb_settings(c.logger, Path("RUN"))
    assert (got["mode"], got["project"], got["dir"]) == want
