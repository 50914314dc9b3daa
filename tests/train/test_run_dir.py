"""Runs never mix: where a run goes and whether there is anything to do is decided before anything is
written. decide() is the main process's decision (a filesystem read); the trainer-level behaviour,
at world 2, is in test_trainer.py (test_runs_never_mix)."""

import json
import os

import pytest
from omegaconf import OmegaConf

from minidist.cli.compose import compose_config
from minidist.train.run_dir import Action, RunRequest, decide, fingerprint, write_config


@pytest.fixture(scope="module")
def base():
    return compose_config(["experiment=gpt_tiny", "trainer.steps=8"])


def _cfg(base, tmp_path, **updates):
    cfg = base.copy()
    OmegaConf.update(cfg, "out_dir", str(tmp_path))
    for key, value in updates.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def _make_run(cfg, name: str, final_step: int | None = None, mtime: float | None = None):
    """A run directory as the trainer leaves it: .hydra/config.yaml and metrics.jsonl."""
    d = _dir(cfg, name)
    plan = decide(cfg, RunRequest(dir=d, named=True))
    write_config(plan, cfg, RunRequest(overrides=("x=1",)))
    rows = [{"step": 4, "train/loss": 1.0}] + ([{"step": final_step, "final/loss": 0.5}] if final_step else [])
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if mtime is not None:
        os.utime(d / "metrics.jsonl", (mtime, mtime))
    return d


def _dir(cfg, name):
    from pathlib import Path
    return Path(cfg.out_dir) / name


def test_a_new_run_gets_a_fresh_named_directory(base, tmp_path):
    plan = decide(_cfg(base, tmp_path))
    assert plan.action is Action.NEW and plan.dir.parent == tmp_path
    assert plan.dir.name.startswith("gpt-ddp-") and plan.label == plan.dir.name
    assert not plan.dir.exists()  # deciding writes nothing


def test_reusing_a_name_without_resume_is_refused(base, tmp_path):
    cfg = _cfg(base, tmp_path, name="a")
    _make_run(cfg, "a")
    before = (tmp_path / "a" / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match="already holds a run; resume=auto continues it, or choose another name="):
        decide(cfg)
    assert decide(_cfg(base, tmp_path, name="a", resume="auto")).action is Action.RESUME
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == before


def test_a_directory_with_foreign_files_is_refused_too(base, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a run")
    with pytest.raises(ValueError, match="already holds files"):
        decide(_cfg(base, tmp_path), RunRequest(dir=tmp_path / "mine", named=True))


def test_a_finished_run_is_left_alone(base, tmp_path):
    _make_run(_cfg(base, tmp_path, name="done"), "done", final_step=8)
    for resume in ("never", "auto"):
        plan = decide(_cfg(base, tmp_path, name="done", resume=resume))
        assert plan.action is Action.FINISHED and plan.step == 8 and "nothing to do" in plan.message
    # asking for more steps continues it (from its latest checkpoint)
    assert decide(_cfg(base, tmp_path, name="done", resume="auto", trainer__steps=16)).action is Action.RESUME


def test_resume_auto_without_a_name_continues_the_latest_run_of_the_same_config(base, tmp_path):
    cfg = _cfg(base, tmp_path)
    _make_run(cfg, "old", mtime=1_000_000)
    _make_run(cfg, "newer", mtime=2_000_000)
    _make_run(_cfg(base, tmp_path, optim__lr=0.5), "other-lr", mtime=3_000_000)  # newest, another config
    plan = decide(_cfg(base, tmp_path, resume="auto", trainer__steps=12, logger__mode="offline"))
    assert plan.dir == tmp_path / "newer" and plan.action is Action.RESUME
    assert "continuing" in plan.message and "the latest run of this config" in plan.message


def test_resume_auto_without_a_name_says_when_there_is_none(base, tmp_path):
    _make_run(_cfg(base, tmp_path, optim__lr=0.5), "other-lr")
    plan = decide(_cfg(base, tmp_path, resume="auto"))
    assert plan.action is Action.NEW and plan.dir.parent == tmp_path and plan.dir.name != "other-lr"
    assert plan.message.startswith("resume=auto: no earlier run of this config under")


def test_same_config_ignores_where_and_how_long_not_what(base, tmp_path):
    a = OmegaConf.to_container(_cfg(base, tmp_path), enum_to_str=True)
    b = OmegaConf.to_container(_cfg(base, tmp_path / "x", name="n", resume="auto", trainer__steps=99,
                                    logger__mode="online", timeout_s=5.0), enum_to_str=True)
    c = OmegaConf.to_container(_cfg(base, tmp_path, trainer__batch_size=3), enum_to_str=True)
    assert fingerprint(a) == fingerprint(b) and fingerprint(a) != fingerprint(c)


def test_run_directory_holds_what_hydra_users_look_for(base, tmp_path):
    d = _make_run(_cfg(base, tmp_path, name="h"), "h")
    assert OmegaConf.load(d / ".hydra" / "config.yaml").model.n_layer == 2
    assert OmegaConf.load(d / ".hydra" / "overrides.yaml") == ["x=1"]
