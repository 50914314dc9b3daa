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


def _checkpoint(d, step: int = 4) -> None:
    """A checkpoint as decide() sees one: its COMPLETE marker (its files are verified when it is loaded)."""
    (d / "checkpoints" / f"step_{step:07d}").mkdir(parents=True)
    (d / "checkpoints" / f"step_{step:07d}" / "COMPLETE").write_text("{}")


def test_a_finished_run_is_left_alone(base, tmp_path):
    d = _make_run(_cfg(base, tmp_path, name="done"), "done", final_step=8)
    for resume in ("never", "auto"):
        plan = decide(_cfg(base, tmp_path, name="done", resume=resume))
        assert plan.action is Action.FINISHED and plan.step == 8 and "nothing to do" in plan.message
        assert "it kept no checkpoint to train on from: choose another name=" in plan.message, plan.message
        with pytest.raises(ValueError, match=r"holds a run of another model: model.n_layer=3 \(the run's: 2\)"):
            decide(_cfg(base, tmp_path, name="done", resume=resume, model__n_layer=3))  # not "nothing to do"
    # asking for more steps of a run with no checkpoint would train it again over its outputs: refused
    before = sorted(p.name for p in d.rglob("*"))
    with pytest.raises(ValueError, match=r"finished at step 8 and kept no checkpoint, so trainer.steps=16 would train "
                                         r"it again from step 0 over its outputs; choose another name="):
        decide(_cfg(base, tmp_path, name="done", resume="auto", trainer__steps=16))
    assert sorted(p.name for p in d.rglob("*")) == before
    # with a checkpoint, more steps continue it (from that checkpoint), and the advice says so
    _checkpoint(d)
    assert "raise trainer.steps with resume=auto" in decide(_cfg(base, tmp_path, name="done")).message
    plan = decide(_cfg(base, tmp_path, name="done", resume="auto", trainer__steps=16))
    assert plan.action is Action.RESUME and "no checkpoint" not in plan.message, plan.message


def test_a_relaunch_says_what_changed_and_refuses_a_model_that_cannot_load(base, tmp_path):
    d = _make_run(_cfg(base, tmp_path, name="r"), "r")
    relaunch = dict(name="r", resume="auto")
    plan = decide(_cfg(base, tmp_path, **relaunch))  # no checkpoint: starts over, and says so in one line
    assert plan.action is Action.RESUME and plan.message == f"resume=auto: no checkpoint in {d.resolve()}: starting " \
                                                            f"from step 0", plan.message
    with pytest.raises(ValueError) as refused:  # another model in a run without a checkpoint: refused
        decide(_cfg(base, tmp_path, model__n_layer=3, **relaunch))
    assert "holds a run of another model: model.n_layer=3 (the run's: 2)" in str(refused.value)
    _checkpoint(d)
    with pytest.raises(ValueError) as refused:  # its weights cannot load: refused, naming the keys and the ways on
        decide(_cfg(base, tmp_path, model__n_layer=3, model__n_embd=64, **relaunch))
    line = str(refused.value)
    assert "\n" not in line and "model.n_embd=64 (the run's: 32), model.n_layer=3 (the run's: 2); its weights " \
        "cannot load into this model. Continue it with its own settings" in line and "another name=" in line, line
    plan = decide(_cfg(base, tmp_path, strategy__name="full_shard", model__dropout=0.1, data__max_bytes=250000,
                       optim__lr=0.02, **relaunch))
    assert plan.action is Action.RESUME and plan.message.splitlines() == [
        "data.max_bytes: 300000 in the run, 250000 now: continuing on the new data from the saved position",
        "model.dropout: 0.0 in the run, 0.1 now: continuing with the new value (the saved weights load: same "
        "parameter shapes)",
        "optim.lr: 0.01 in the run, 0.02 now: the new value applies from the resumed step",
        "strategy.name: ddp in the run, full_shard now: continuing under the new strategy"], plan.message


def test_an_unwritable_out_dir_is_refused_before_anything_runs(base, tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match=r"cannot create the run directory .*a_file/x: .*a_file is a file, not a "
                                         r"directory; choose another out_dir="):
        decide(_cfg(base, tmp_path / "a_file", name="x"))
    with pytest.raises(ValueError, match=r"/proc is not writable .*; choose another out_dir="):
        decide(_cfg(base, "/proc/minidist", name="x"))
    assert decide(_cfg(base, tmp_path / "new" / "deeper", name="x")).action is Action.NEW
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]  # the probe leaves nothing


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
