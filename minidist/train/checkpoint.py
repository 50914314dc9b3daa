"""Checkpoints: every file a run writes to resume, in one module.

    <run dir>/checkpoints/step_0000200/
        model.pt           the whole model (+ a replicated optimizer), from the main process
        shard_dp{r}.pt     data-parallel rank r's shards: the model's (FSDP) or the optimizer's (ZeRO-1)
        state_dp{r}.pt     rank r's RNG states, and the step and data position (the same on every rank)
        manifest_dp{r}.json  sha256 and size of each file rank r wrote
        COMPLETE           the merged manifest, written by the main process once every rank's files are synced

What goes where is decided by what the wrapped objects offer, not by a strategy name:
a model with `sharded_state_dict(optimizer)` (FSDP) saves its shards together with the
optimizer state that belongs to them; otherwise the main process saves the whole model,
and an optimizer with `sharded_state_dict()` (ZeRO-1) saves one shard per rank. Sharded
files are read back from every saved rank and the engines cut out what the current layout
needs, so a checkpoint written at N processes resumes at M.

Why a checksum and fsync: a checkpoint must either load exactly as written or be refused.
Every file is fsync'ed (and its directory) before COMPLETE exists, so a power cut cannot leave
a marked checkpoint with missing bytes; every file's sha256 is verified before torch.load
sees it, so a flipped bit or a truncated file is named and skipped (the newest checkpoint
that verifies is used) instead of resuming with wrong weights. Everything is loaded with
weights_only=True: tensors and plain values, never pickled objects.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.mesh import dp_rank, dp_size, is_main
from minidist.train.parallelize import unwrap

MARKER = "COMPLETE"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and the reason."""


# ------------------------------------------------------------------------------ files
def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(data: bytes, path: Path) -> None:
    """Write to a temporary name, fsync, rename into place, fsync the directory."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_file(obj, path: Path) -> dict:
    """torch.save `obj` durably; returns its manifest entry {"sha256", "bytes"}."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    write_bytes_durably(data, path)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def load_file(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


def verify(d: Path) -> str | None:
    """None if every file COMPLETE lists has its recorded size and sha256; else why not (one line)."""
    try:
        manifest = json.loads((d / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MARKER}: unreadable manifest ({type(exc).__name__})"
    for name, want in sorted(manifest.items()):
        try:
            data = (d / name).read_bytes()
        except OSError:
            return f"{name}: missing"
        if len(data) != want["bytes"]:
            return f"{name}: {len(data)} bytes, {want['bytes']} written (truncated or overwritten)"
        got = hashlib.sha256(data).hexdigest()
        if got != want["sha256"]:
            return f"{name}: checksum mismatch (sha256 {got[:12]}..., {want['sha256'][:12]}... written)"
    return None


# -------------------------------------------------------------------------------- rng
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


# ------------------------------------------------------------------------ checkpointer
class Checkpointer:
    """Saves, verifies and loads the checkpoints of one run directory (the same path on every rank)."""

    def __init__(self, run_dir: Path, keep_last: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 mesh: DeviceMesh):
        self.root = run_dir / "checkpoints"
        self.keep_last = max(1, keep_last)
        self.model, self.optimizer, self.mesh = model, optimizer, mesh
        self.rank, self.main = dp_rank(mesh), is_main(mesh)

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:07d}"

    def complete(self) -> list[Path]:
        """Checkpoint directories marked COMPLETE, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(d for d in self.root.glob("step_???????") if (d / MARKER).exists())

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: dict) -> Path:
        """Every rank writes its files into step_N.partial/; the main process marks and publishes it.

        The directory appears under its real name only by a rename, once COMPLETE (the merged
        manifest) is inside: a crash at any point leaves either the old set or a .partial to ignore.
        """
        final, part = self.step_dir(step), self.step_dir(step).with_suffix(".partial")
        if self.main:
            shutil.rmtree(part, ignore_errors=True)  # a crashed attempt's leftovers
            part.mkdir(parents=True)
        comm.barrier()
        files = self._save_model_and_optimizer(part)
        files[f"state_dp{self.rank}.pt"] = save_file(
            state | {"rng": rng_state(), "world_size": dp_size(self.mesh)}, part / f"state_dp{self.rank}.pt")
        write_bytes_durably(json.dumps(files).encode(), part / f"manifest_dp{self.rank}.json")
        comm.barrier()  # every rank's files are on disk
        if self.main:
            merged: dict = {}
            for m in sorted(part.glob("manifest_dp*.json")):
                merged |= json.loads(m.read_text())
            write_bytes_durably(json.dumps({"step": step, "files": merged}, indent=1).encode(), part / MARKER)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(part, final)
            _fsync_dir(self.root)
            for old in self.complete()[:-self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        comm.barrier()  # nobody resumes from / deletes a directory others still read
        return final

    def _save_model_and_optimizer(self, d: Path) -> dict:
        model, opt, files = self.model, self.optimizer, {}
        shard = f"shard_dp{self.rank}.pt"
        if hasattr(model, "sharded_state_dict"):
            files[shard] = save_file(model.sharded_state_dict(optimizer=opt), d / shard)
            return files
        sharded_opt = hasattr(opt, "sharded_state_dict")
        if sharded_opt:
            files[shard] = save_file(opt.sharded_state_dict(), d / shard)
        if self.main:
            whole = {"model": unwrap(model).state_dict()}
            if not sharded_opt:
                whole["optimizer"] = opt.state_dict()
            files["model.pt"] = save_file(whole, d / "model.pt")
        return files

    # ------------------------------------------------------------------ find
    def usable(self, explicit: Path | None = None) -> Path | None:
        """The checkpoint to resume from: `explicit`, or the newest complete one that verifies.

        Every rank verifies the same files and so reaches the same verdict without talking.
        A bad newest checkpoint is skipped with one warning naming the file and the reason.
        """
        if explicit is not None:
            why = verify(explicit) if (explicit / MARKER).exists() else f"no {MARKER} marker (incomplete)"
            if why:
                raise CheckpointError(f"checkpoint {explicit} cannot be used: {why}")
            return explicit
        reasons = []
        for d in reversed(self.complete()):
            why = verify(d)
            if why is None:
                return d
            reasons.append(f"{d.name}: {why}")
            if self.main:
                print(f"warning: skipping checkpoint {d}: {why}", file=sys.stderr, flush=True)
        if reasons:
            raise CheckpointError(f"no checkpoint in {self.root} verifies ({'; '.join(reasons)}); "
                                  f"resume=never starts over")
        return None

    # ------------------------------------------------------------------ load
    def load(self, d: Path) -> dict:
        """Restore model, optimizer and RNG from a verified checkpoint; return its step and data position.

        At another number of processes: the engines reshard, the data position is the job's
        (see BatchStream), and ranks without a saved RNG state keep their seeded one.
        """
        files = json.loads((d / MARKER).read_text())["files"]
        state = load_file(d / "state_dp0.pt")  # step and data position: the same on every rank
        self._check_model_matches(d, files)
        self._load_model_and_optimizer(d, files)
        own = f"state_dp{self.rank}.pt"
        if own in files:
            set_rng_state(load_file(d / own)["rng"] if self.rank else state["rng"])
        return state

    def _shards(self, d: Path, files: dict) -> list[dict]:
        names = sorted((n for n in files if n.startswith("shard_dp")), key=lambda n: int(n[8:-3]))
        return [load_file(d / n) for n in names]

    def _load_model_and_optimizer(self, d: Path, files: dict) -> None:
        model, opt = self.model, self.optimizer
        if hasattr(model, "load_sharded_state_dict"):
            model.load_sharded_state_dict(self._shards(d, files), optimizer=opt)
            return
        whole = load_file(d / "model.pt")
        unwrap(model).load_state_dict(whole["model"])
        if hasattr(opt, "load_sharded_state_dict"):
            opt.load_sharded_state_dict(self._shards(d, files))
        else:
            opt.load_state_dict(whole["optimizer"])

    def _check_model_matches(self, d: Path, files: dict) -> None:
        """Name the first differing parameters instead of torch's cut-off 'Error(s) in loading state_dict'."""
        if hasattr(self.model, "sharded_state_dict"):
            first = load_file(d / min((n for n in files if n.startswith("shard_dp")), key=lambda n: int(n[8:-3])))
            saved = {k: tuple(v["global_shape"]) for k, v in first["params"].items()}
            ours = {k: tuple(v["global_shape"]) for k, v in self.model.sharded_state_dict()["params"].items()}
        else:
            saved = {k: tuple(v.shape) for k, v in load_file(d / "model.pt")["model"].items()}
            ours = {k: tuple(v.shape) for k, v in unwrap(self.model).state_dict().items()}
        diffs = [f"'{k}' {saved.get(k, 'missing')} in the checkpoint vs {ours.get(k, 'missing')} in the model"
                 for k in sorted(saved.keys() | ours.keys()) if saved.get(k) != ours.get(k)]
        if diffs:
            more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
            raise CheckpointError(f"checkpoint {d} does not match the configured model: {'; '.join(diffs[:3])}{more}; "
                                  f"resume with the model settings in the run's .hydra/config.yaml, or start a new run")
