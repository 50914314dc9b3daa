"""Checkpoints: every file a run writes to resume, in one module.

    <run dir>/checkpoints/step_0000200/
        model.pt          the whole model (+ a replicated optimizer) from the main process
        shard_dp{r}.pt    data-parallel rank r's shards: the model's (FSDP) or the optimizer's (ZeRO-1)
        state_dp{r}.pt    rank r's step, data position and RNG states
        COMPLETE          written by the main process after a barrier: every file above exists

What goes where is decided by what the wrapped objects offer, not by a strategy name:
a model with `sharded_state_dict(optimizer)` (FSDP) saves its shards together with the
optimizer state that belongs to them; otherwise the main process saves the whole model,
and an optimizer with `sharded_state_dict()` (ZeRO-1) saves one shard per rank.
Sharded files are read back from every saved rank, so the engines can cut out what the
current layout needs.

Files are written to a temporary name and os.replace'd into place, so a crash mid-write
leaves no half file under the real name; a directory without COMPLETE is ignored on
resume and overwritten by the next save of the same step. Only the newest `keep_last`
complete directories are kept. Everything is loaded with weights_only=True: tensors and
plain Python values, never pickled objects. Multi-node runs need the run directory on a
filesystem every node sees.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.mesh import dp_rank, dp_size, is_main
from minidist.train.parallelize import unwrap

MARKER = "COMPLETE"


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_file(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


def rng_state() -> dict:
    """This rank's RNG states as tensors and plain values (weights_only-loadable)."""
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    """Saves and finds the checkpoints of one run directory (the same path on every rank)."""

    def __init__(self, run_dir: Path, keep_last: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 mesh: DeviceMesh):
        self.root = run_dir / "checkpoints"
        self.keep_last = max(1, keep_last)
        self.model, self.optimizer, self.mesh = model, optimizer, mesh
        self.rank, self.main = dp_rank(mesh), is_main(mesh)

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:07d}"

    def complete(self) -> list[Path]:
        """Complete checkpoint directories, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(d for d in self.root.glob("step_*") if (d / MARKER).exists())

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: dict) -> Path:
        """Every rank writes its part; then a barrier; then the main process marks the directory complete."""
        d = self.step_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        if self.main:
            (d / MARKER).unlink(missing_ok=True)  # re-saving a step: it is incomplete until re-marked
        self._save_model_and_optimizer(d)
        atomic_save(state | {"rng": rng_state(), "world_size": dp_size(self.mesh)}, d / f"state_dp{self.rank}.pt")
        comm.barrier()  # the whole job: every rank has written its files
        if self.main:
            (d / MARKER).write_text(f"{step}\n")
            for old in self.complete()[:-self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        comm.barrier()  # nobody resumes from / deletes a dir others still read
        return d

    def _save_model_and_optimizer(self, d: Path) -> None:
        model, opt = self.model, self.optimizer
        if hasattr(model, "sharded_state_dict"):
            atomic_save(model.sharded_state_dict(optimizer=opt), d / f"shard_dp{self.rank}.pt")
            return
        sharded_opt = hasattr(opt, "sharded_state_dict")
        if sharded_opt:
            atomic_save(opt.sharded_state_dict(), d / f"shard_dp{self.rank}.pt")
        if self.main:
            whole = {"model": unwrap(model).state_dict()}
            if not sharded_opt:
                whole["optimizer"] = opt.state_dict()
            atomic_save(whole, d / "model.pt")

    # ------------------------------------------------------------------ load
    def load(self, d: Path) -> dict:
        """Restore model, optimizer and RNG; return this rank's saved state (step, data position, ...)."""
        if not (d / MARKER).exists():
            raise RuntimeError(f"checkpoint {d} is incomplete (no {MARKER} marker); pick another or resume=auto")
        state = load_file(d / f"state_dp{self.rank}.pt") if (d / f"state_dp{self.rank}.pt").exists() else None
        if state is None or state["world_size"] != dp_size(self.mesh):
            saved = state["world_size"] if state else len(list(d.glob("state_dp*.pt")))
            raise RuntimeError(f"checkpoint {d} was written by {saved} data-parallel ranks, this run has "
                               f"{dp_size(self.mesh)}; resume with the same number of processes")
        self._load_model_and_optimizer(d)
        set_rng_state(state["rng"])
        return state

    def _load_model_and_optimizer(self, d: Path) -> None:
        model, opt = self.model, self.optimizer
        if hasattr(model, "load_sharded_state_dict"):
            model.load_sharded_state_dict(self._all_shards(d), optimizer=opt)
            return
        whole = load_file(d / "model.pt")
        unwrap(model).load_state_dict(whole["model"])
        if hasattr(opt, "load_sharded_state_dict"):
            opt.load_sharded_state_dict(self._all_shards(d))
        else:
            opt.load_state_dict(whole["optimizer"])

    @staticmethod
    def _all_shards(d: Path) -> list[dict]:
        """Every saved rank's shard file: the engine reassembles what this rank now owns."""
        files = sorted(d.glob("shard_dp*.pt"), key=lambda p: int(p.stem.removeprefix("shard_dp")))
        return [load_file(f) for f in files]
