"""Where a run lives, and whether there is anything to do there: decided before anything is written.

    plan = plan_run(cfg, topo, mesh, request)   # a collective: the main process decides, every rank learns
    plan.dir, plan.action                       # Action.NEW, RESUME or FINISHED

A run's directory is <out_dir>/<name>, or the directory Hydra gave the job (hydra.run.dir,
hydra.sweep.dir/hydra.sweep.subdir: `request`). Runs never mix:

- a directory that already holds something is refused unless resume= is set: reusing a
  name must not append to another run's metrics or overwrite its checkpoints;
- a finished run (its metrics hold the final row at >= trainer.steps) is left alone: re-running
  the same command does nothing and says so;
- resume=auto without a name (and without hydra.run.dir) continues the latest run under out_dir
  of the *same config*, or says there is none and starts a new one. Same config = the composed
  config with name, out_dir, resume, timeout_s, trainer.steps, trainer.progress_bar and logger
  removed (none of them changes what the run computes up to a step; steps may grow).

The main process reads the filesystem and decides (two ranks reading a clock could straddle a
second, two ranks listing a directory could see different things); the decision reaches every
rank in one broadcast, including a refusal, which every rank then raises (one line each).
"""

from __future__ import annotations

import datetime
import enum
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from minidist import Topology, comm
from minidist.mesh import is_main, main_rank
from minidist.runtime import UsageError
from minidist.train import relaunch
from minidist.train.checkpoint_files import MARKER

PLAN_BYTES = 8192
HYDRA_DIR = ".hydra"
NOT_CONFIG = ("name", "out_dir", "resume", "timeout_s", "logger")
NOT_CONFIG_TRAINER = ("steps", "progress_bar")
_stamp: str | None = None


class Action(enum.Enum):
    NEW = "new"
    RESUME = "resume"
    FINISHED = "finished"


@dataclass(frozen=True)
class RunRequest:
    """What the launcher (the Hydra command line) asks for; without one: <out_dir>/<name>."""

    dir: Path | None = None
    """The job's directory (Hydra's output dir); None = <out_dir>/<name or a new one>."""
    named: bool = False
    """The user chose the directory (name=, hydra.run.dir=, a sweep job): resume=auto never searches."""
    overrides: tuple[str, ...] | None = None
    """The command line's overrides: <run>/.hydra/overrides.yaml."""
    hydra_yaml: str | None = None
    """Hydra's own config for this job: <run>/.hydra/hydra.yaml."""
    command: str | None = None
    """The command line that continues this run (said when it stops on a signal); None: not known."""


@dataclass(frozen=True)
class RunPlan:
    dir: Path
    action: Action
    label: str
    """The run's name for progress bars and wandb: its path under out_dir."""
    message: str = ""
    """Said by the main process when the run starts (empty: nothing to say)."""
    step: int = 0
    """FINISHED: the step it finished at."""


def stamp() -> str:
    """This job's timestamp for new names: shared by every rank once share_stamp() ran, else now."""
    return _stamp or datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def share_stamp(topo: Topology) -> str:
    """Rank 0's clock, on every rank (a collective): Hydra resolves the same directory names everywhere."""
    global _stamp
    _stamp = _broadcast_text(datetime.datetime.now().strftime("%Y%m%d-%H%M%S") if topo.rank == 0 else "", topo, 0)
    return _stamp


def auto_name(name, *parts) -> str:
    """`name`, or parts-<stamp>."""
    return str(name) if name else "-".join([*map(str, parts), stamp()])


def hydra_dir(kind: str, *, _root_) -> str:
    """The resolver ${minidist.dir:run} / ${minidist.dir:sweep}: Hydra's default hydra.run.dir
    <out_dir>/<name or model-strategy-time> and hydra.sweep.dir <out_dir>/<name or multirun-time>.
    Shown without the run's config (`--cfg hydra --resolve`), it describes itself instead."""
    if "out_dir" not in _root_:
        return "<out_dir>/<name>" if kind == "run" else "<out_dir>/<name or multirun-time>"
    parts = (_root_.model.name, _root_.strategy.name) if kind == "run" else ("multirun",)
    return f"{_root_.out_dir}/{auto_name(_root_.get('name'), *parts)}"


def config_file(run_dir: Path) -> Path:
    """The composed config of a run, where Hydra users look for it."""
    return Path(run_dir) / HYDRA_DIR / "config.yaml"


def fingerprint(config: dict) -> dict:
    """What makes two runs 'the same config' for resume=auto (see the module docstring)."""
    out = {k: v for k, v in config.items() if k not in NOT_CONFIG}
    out["trainer"] = {k: v for k, v in out.get("trainer", {}).items() if k not in NOT_CONFIG_TRAINER}
    return out


def finished_step(run_dir: Path) -> int | None:
    """The step of the run's final row in metrics.jsonl (written by trainer.finish), or None."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return None
    step = None
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut off by a crash
        if any(k.startswith("final/") for k in row):
            step = int(row["step"])
    return step


def latest_same_config(out_dir: Path, config: dict) -> Path | None:
    """The most recently active run directly under out_dir whose config matches, or None."""
    want, found = fingerprint(config), []
    for cfg_file in Path(out_dir).glob(f"*/{HYDRA_DIR}/config.yaml"):
        try:
            theirs = OmegaConf.to_container(OmegaConf.load(cfg_file))
        except Exception:  # noqa: BLE001 - not a readable run config: not a candidate
            continue
        if isinstance(theirs, dict) and fingerprint(theirs) == want:
            run = cfg_file.parent.parent
            metrics = run / "metrics.jsonl"
            found.append(((metrics if metrics.exists() else cfg_file).stat().st_mtime, run))
    return max(found)[1] if found else None


def decide(cfg, request: RunRequest | None = None) -> RunPlan:
    """The main process's decision (reads the filesystem, writes nothing); raises ValueError to refuse."""
    request = request or RunRequest()
    out_dir = Path(cfg.out_dir)
    run_dir = request.dir or out_dir / auto_name(cfg.name, cfg.model.name, cfg.strategy.name)
    named = request.named or bool(cfg.name)
    message = ""
    if cfg.resume == "auto" and not named:
        config = OmegaConf.to_container(cfg, enum_to_str=True)
        earlier = latest_same_config(out_dir, config)
        if earlier is not None:
            run_dir, message = earlier, f"resume=auto: continuing {earlier.resolve()} (the latest run of this config)"
        else:
            message = f"resume=auto: no earlier run of this config under {out_dir.resolve()}; starting a new one"
    label = _label(run_dir, out_dir)
    if not run_dir.exists() or not any(run_dir.iterdir()):
        check_writable(run_dir)
        if cfg.resume == "auto" and named:  # the first launch of a named run (launch/*.sh): say so
            message = f"resume=auto: no checkpoint in {run_dir.resolve()}: starting from step 0 (a new run)"
        return RunPlan(run_dir, Action.NEW, label, message)
    done, kept = finished_step(run_dir), has_checkpoint(run_dir)
    # what differs from the run's saved config; a model that cannot load is refused even where nothing would run
    notes = relaunch.changes(_saved_fingerprint(run_dir), fingerprint(OmegaConf.to_container(cfg, enum_to_str=True)),
                             run_dir, kept)
    if done is not None and done >= cfg.trainer.steps:
        advice = ("raise trainer.steps with resume=auto to train on from its last checkpoint, or choose another "
                  "name=" if kept else "it kept no checkpoint to train on from: choose another name= for a new run")
        return RunPlan(run_dir, Action.FINISHED, label, f"{run_dir.resolve()} finished at step {done}: nothing to "
                       f"do ({advice})", done)
    if cfg.resume == "never":
        what = "a run" if config_file(run_dir).exists() or (run_dir / "metrics.jsonl").exists() else "files"
        raise ValueError(f"{run_dir.resolve()} already holds {what}; resume=auto continues it, or choose "
                         f"another name= (or hydra.run.dir=) for a new run")
    if done is not None and not kept:
        raise ValueError(f"{run_dir.resolve()} finished at step {done} and kept no checkpoint, so trainer.steps="
                         f"{cfg.trainer.steps} would train it again from step 0 over its outputs; choose another "
                         f"name= for a new run (trainer.ckpt_interval keeps checkpoints to train on from)")
    lines = ([message] if message else []) + notes
    if not kept and cfg.resume == "auto":
        lines.append(f"resume=auto: no checkpoint in {run_dir.resolve()}: starting from step 0")
    return RunPlan(run_dir, Action.RESUME, label, "\n".join(lines))


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run kept a complete checkpoint (its COMPLETE marker; verified when it is loaded)."""
    return any((Path(run_dir) / "checkpoints").glob(f"step_???????/{MARKER}"))


def _saved_fingerprint(run_dir: Path) -> dict:
    """The fingerprint of the run's saved config; {} without a readable one (nothing to compare)."""
    try:
        saved = OmegaConf.to_container(OmegaConf.load(config_file(run_dir)))
    except Exception:  # noqa: BLE001 - absent or unreadable: the run predates .hydra/, or is not one
        return {}
    return fingerprint(saved) if isinstance(saved, dict) else {}


def check_writable(run_dir: Path) -> None:
    """ValueError (one line) unless run_dir exists or can be created: its nearest existing ancestor is a
    directory this process can create entries in (probed by creating and removing one; nothing stays)."""
    import tempfile

    parent = Path(run_dir).resolve()
    while not parent.exists():
        parent = parent.parent
    if parent == Path(run_dir).resolve() and parent.is_dir():
        return
    if not parent.is_dir():
        raise ValueError(f"cannot create the run directory {Path(run_dir).resolve()}: {parent} is a file, not a "
                         f"directory; choose another out_dir= (or name=)")
    try:
        Path(tempfile.mkdtemp(prefix=".minidist-probe-", dir=parent)).rmdir()
    except OSError as exc:
        raise ValueError(f"cannot create the run directory {Path(run_dir).resolve()}: {parent} is not writable "
                         f"({exc.strerror}); choose another out_dir=") from None


def plan_run(cfg, topo: Topology, mesh, request: RunRequest | None = None) -> RunPlan:
    """decide() on the main process, the same plan (or the same refusal) on every rank."""
    main = is_main(mesh)
    src = main_rank(mesh)
    text = ""
    if main:
        try:
            p = decide(cfg, request)
            text = json.dumps({"dir": str(p.dir), "action": p.action.value, "label": p.label,
                               "message": p.message, "step": p.step})
        except (ValueError, OSError) as exc:
            text = json.dumps({"error": str(exc), "usage": isinstance(exc, ValueError)})
    got = json.loads(_broadcast_text(text, topo, src))
    if "error" in got:  # a refusal is a bad input, the same on every rank: printed once (runtime.UsageError)
        raise (UsageError if got["usage"] else RuntimeError)(got["error"])
    return RunPlan(Path(got["dir"]), Action(got["action"]), got["label"], got["message"], got["step"])


def write_config(plan: RunPlan, cfg, request: RunRequest | None) -> None:
    """<run>/.hydra/{config,overrides,hydra}.yaml, as Hydra writes them (main process, after validation)."""
    d = plan.dir / HYDRA_DIR
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    if request is not None and request.overrides is not None:
        (d / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(request.overrides))))
    if request is not None and request.hydra_yaml is not None:
        (d / "hydra.yaml").write_text(request.hydra_yaml)


def _label(run_dir: Path, out_dir: Path) -> str:
    try:
        return str(run_dir.resolve().relative_to(out_dir.resolve()))
    except ValueError:
        return run_dir.name


def _broadcast_text(text: str, topo: Topology, src: int) -> str:
    """A short string from global rank src to every rank (NCCL: device tensors only)."""
    buf = torch.zeros(PLAN_BYTES, dtype=torch.uint8, device=topo.device)
    raw = text.encode()
    if len(raw) > PLAN_BYTES:
        raw = json.dumps({"error": f"run directory plan longer than {PLAN_BYTES} bytes (a very long path?)"}).encode()
    if raw:
        buf[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8, device=topo.device)
    comm.broadcast(buf, src=src)
    return bytes(buf[buf != 0].cpu().tolist()).decode()


def run_dir_for(cfg, topo: Topology, mesh, prefix: str) -> Path:
    """<out_dir>/<name>; without cfg.name, <prefix>-<time> on the main process's clock, shared with every
    rank (for programs other than the trainer, e.g. minidist.compare; the trainer uses plan_run). A
    directory that cannot be created is refused before any work, by the main process for every rank
    (UsageError, one line: check_writable)."""
    text = ""
    if is_main(mesh):
        d = Path(cfg.out_dir) / (cfg.name or f"{prefix}-{stamp()}")
        try:
            check_writable(d)
            text = json.dumps({"dir": str(d)})
        except ValueError as exc:
            text = json.dumps({"error": str(exc)})
    got = json.loads(_broadcast_text(text, topo, main_rank(mesh)))
    if "error" in got:
        raise UsageError(got["error"])
    return Path(got["dir"])
