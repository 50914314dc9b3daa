"""Checkpoints: a directory per step, complete only once a marker says every rank finished.

    <run dir>/checkpoints/step_0000200/
        model.pt            full model (+ optimizer) from rank 0        (strategy.save)
        shard_rank{r}.pt    rank r's shards (zero1 optimizer, FSDP)     (strategy.save)
        state_rank{r}.pt    rank r's step, schedule, data position, RNG states
        COMPLETE            written by rank 0 after a barrier: all files above exist

A crash while saving leaves a directory without COMPLETE; resume ignores it and
the next save of the same step overwrites it. Only the newest `keep_last`
complete directories are kept. All files are loaded with weights_only=True, so
everything in them is tensors and plain Python values (no pickled objects).
Multi-node runs need the run directory on a filesystem every node sees.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from minidist import comm
from minidist.train.strategy import Strategy, atomic_save

MARKER = "COMPLETE"


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
    """Saves and finds checkpoints of one run directory (the same path on every rank)."""

    def __init__(self, run_dir: Path, keep_last: int, strategy: Strategy):
        self.root = run_dir / "checkpoints"
        self.keep_last = max(1, keep_last)
        self.strategy = strategy
        self.topo = strategy.topo

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

    def save(self, step: int, state: dict) -> Path:
        """Every rank writes its part; then a barrier; then rank 0 marks the directory complete."""
        d = self.step_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        if self.topo.is_main:
            (d / MARKER).unlink(missing_ok=True)  # re-saving a step: it is incomplete until re-marked
        self.strategy.save(d)
        atomic_save(state | {"rng": rng_state(), "world_size": self.topo.world_size},
                    d / f"state_rank{self.topo.rank}.pt")
        comm.barrier(group=self.topo.group)
        if self.topo.is_main:
            (d / MARKER).write_text(f"{step}\n")
            for old in self.complete()[:-self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        comm.barrier(group=self.topo.group)  # nobody resumes from / deletes a dir others still read
        return d

    def load(self, d: Path) -> dict:
        """Restore model, optimizer and RNG; return this rank's saved state (step, data position, ...)."""
        if not (d / MARKER).exists():
            raise RuntimeError(f"checkpoint {d} is incomplete (no {MARKER} marker); pick another or resume=auto")
        state = torch.load(d / f"state_rank{self.topo.rank}.pt", map_location="cpu", weights_only=True)
        if state["world_size"] != self.topo.world_size:
            raise RuntimeError(f"checkpoint {d} was written by {state['world_size']} ranks, this run has "
                               f"{self.topo.world_size}; resume with the same number of processes")
        self.strategy.load(d)
        set_rng_state(state["rng"])
        return state
