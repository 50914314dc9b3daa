"""Checkpoints: every file a run writes to resume, in one module.

    <run dir>/checkpoints/step_0000200/
        model.pt              the whole model, and a plain optimizer's whole state by parameter name
                              (minidist.train.portable), written by the main process
        shard_{coord}.pt      the rank at mesh coordinate coord: its engine's sharded state, the
                              model's and its optimizer's (FSDP) or the optimizer's (ZeRO-1)
        state_{coord}.pt      its RNG states, and the step and data position (the same on every rank)
        manifest_{coord}.json sha256 and size of each file it wrote
        COMPLETE              the merged manifest and what wrote it (strategy, mesh, what is whole and
                              what sharded, the whole model's shapes), by the main process, last

coord is the rank's coordinate on every mesh dimension ("dp1", "replicate0_shard1",
"dp0_tp1"), so two ranks that differ in any dimension never write the same file. What goes
where is decided by what the wrapped objects offer, not by a strategy name: a model with
`sharded_state_dict(optimizer)` (FSDP) saves its shards together with the optimizer state
that belongs to them; otherwise the main process saves the whole model (tensor-parallel
slices gathered first), and an optimizer with `sharded_state_dict()` (ZeRO-1) saves one
shard per rank. Sharded files are read back from every saved rank of the same tp slice
and the engines cut out what the current layout needs, so a checkpoint written at N
processes resumes at M.

Across strategies: a whole model loads into any strategy (FSDP through its
load_full_state_dict), and a whole optimizer state into any plain optimizer, FSDP's
included (see minidist.train.portable); sharded files load into any engine that reads
them (FSDP's into every FSDP strategy, at any world size). Anything else is refused in
one line naming the strategy that wrote the checkpoint, except an optimizer state that
only its own engine reads: the weights are loaded, the optimizer starts afresh, and the
run says so. Checkpoints from before the layout record (files keyed by dp rank) load
as they did.

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
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from minidist import comm
from minidist.mesh import TP, Layout
from minidist.train import portable
from minidist.train.parallelize import FSDP_STRATEGIES, unwrap

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


# ---------------------------------------------------------------------------- contents
WHOLE, SHARDED, WITH_MODEL = "whole", "sharded", "with_model"
"""Where a checkpoint keeps the model / the optimizer state: model.pt, the shard files, or inside
the model's shards (FSDP saves each shard's optimizer state with it)."""


@dataclass(frozen=True)
class Contents:
    """What a checkpoint holds and what wrote it: COMPLETE's "layout" entry (inferred for older ones)."""

    strategy: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    model: str
    optimizer: str
    shapes: dict[str, tuple[int, ...]] | None
    """The whole model's state_dict shapes (None: read them from the files)."""
    legacy: bool = False
    """Written before the layout record: every file keyed by the data-parallel rank, "dp{r}"."""

    def key(self, layout: Layout) -> str | None:
        """The file key this rank's files have in this checkpoint, if it has one."""
        if self.legacy:
            return f"dp{layout.dp_rank}" if layout.size(TP) == 1 else None
        return layout.key if self.dims == layout.names else None

    @property
    def main_key(self) -> str:
        return "dp0" if self.legacy else "_".join(f"{n}0" for n in self.dims)

    @property
    def tp(self) -> int:
        return dict(zip(self.dims, self.shape)).get(TP, 1)

    def record(self) -> dict:
        return {"strategy": self.strategy, "dims": list(self.dims), "shape": list(self.shape), "model": self.model,
                "optimizer": self.optimizer, "shapes": {k: list(v) for k, v in (self.shapes or {}).items()}}


def contents(d: Path, manifest: dict) -> Contents:
    """What COMPLETE says the checkpoint in `d` holds, or what its files show (older checkpoints)."""
    if "layout" in manifest:
        r = manifest["layout"]
        return Contents(r["strategy"], tuple(r["dims"]), tuple(r["shape"]), r["model"], r["optimizer"],
                        {k: tuple(v) for k, v in r["shapes"].items()})
    files = manifest["files"]
    shards = any(n.startswith("shard_") for n in files)
    if "model.pt" not in files:
        model, optimizer = SHARDED, WITH_MODEL
    else:
        model, optimizer = WHOLE, SHARDED if shards else WHOLE
    return Contents(_strategy_of_run(d) or ("an FSDP strategy" if model == SHARDED else "zero1" if shards
                                            else "single or ddp"), (), (), model, optimizer, None, legacy=True)


def _strategy_of_run(d: Path) -> str | None:
    """strategy.name in the run's .hydra/config.yaml (<run>/checkpoints/step_N/), if it says."""
    try:
        text = (d.parent.parent / ".hydra" / "config.yaml").read_text()
    except OSError:
        return None
    m = re.search(r"^strategy:\n(?:  .*\n)*?  name: (\S+)", text, re.M)
    return m.group(1) if m else None


def _coordinate(file_key: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"([a-z]+)(\d+)", file_key)}


# ------------------------------------------------------------------------ checkpointer
class Checkpointer:
    """Saves, verifies and loads the checkpoints of one run directory (the same path on every rank).

    shapes: the whole model's state_dict shapes (before any wrapper), recorded so that a
    changed model is named without opening an engine's files; strategy: its name, for messages.
    """

    def __init__(self, run_dir: Path, keep_last: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 layout: Layout, *, shapes: dict[str, tuple[int, ...]], strategy: str):
        self.root = run_dir / "checkpoints"
        self.keep_last = max(1, keep_last)
        self.model, self.optimizer, self.layout = model, optimizer, layout
        self.shapes, self.strategy = {k: tuple(v) for k, v in shapes.items()}, strategy
        self.main = layout.is_main

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
        files, what = self._save_model_and_optimizer(part)
        key = self.layout.key
        files[f"state_{key}.pt"] = save_file(
            state | {"rng": rng_state(), "world_size": self.layout.size()}, part / f"state_{key}.pt")
        write_bytes_durably(json.dumps(files).encode(), part / f"manifest_{key}.json")
        comm.barrier()  # every rank's files are on disk
        if self.main:
            merged: dict = {}
            for m in sorted(part.glob("manifest_*.json")):
                merged |= json.loads(m.read_text())
            record = Contents(self.strategy, self.layout.names, tuple(self.layout.mesh.shape), *what,
                              self.shapes).record()
            write_bytes_durably(json.dumps({"step": step, "files": merged, "layout": record}, indent=1).encode(),
                                part / MARKER)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(part, final)
            _fsync_dir(self.root)
            for old in self.complete()[:-self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        comm.barrier()  # nobody resumes from / deletes a directory others still read
        return final

    def _save_model_and_optimizer(self, d: Path) -> tuple[dict, tuple[str, str]]:
        """This rank's files, and where the model and the optimizer state went (WHOLE / SHARDED / WITH_MODEL)."""
        model, opt, files = self.model, self.optimizer, {}
        shard = f"shard_{self.layout.key}.pt"
        if hasattr(model, "sharded_state_dict"):
            files[shard] = save_file(model.sharded_state_dict(optimizer=opt), d / shard)
            return files, (SHARDED, WITH_MODEL)
        sharded_opt = hasattr(opt, "sharded_state_dict")
        if sharded_opt:
            files[shard] = save_file(opt.sharded_state_dict(), d / shard)
        whole = portable.whole_state(model, None if sharded_opt else opt, self.layout)  # a collective
        if self.main:
            files["model.pt"] = save_file(whole, d / "model.pt")
        return files, (WHOLE, SHARDED if sharded_opt else WHOLE)

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
        """Restore model, optimizer and RNG from a verified checkpoint; return its step and data position
        (and "note": what could not be carried over, for the run's log; "" when everything was).

        At another number of processes: the engines reshard, the data position is the job's
        (see BatchStream), and ranks without a saved RNG state keep their seeded one.
        """
        manifest = json.loads((d / MARKER).read_text())
        files, what = manifest["files"], contents(d, manifest)
        self._check_can_read(d, what)
        self._check_model_matches(d, files, what)
        state = load_file(d / f"state_{what.main_key}.pt")  # step and data position: the same on every rank
        note = self._load_model_and_optimizer(d, files, what)
        own = what.key(self.layout)
        if own is not None and f"state_{own}.pt" in files:
            set_rng_state(load_file(d / f"state_{own}.pt")["rng"] if own != what.main_key else state["rng"])
        return state | {"note": note}

    def _shards(self, d: Path, files: dict, what: Contents) -> list[dict]:
        """Every saved rank's shard file of this rank's tp slice, in coordinate order."""
        mine = self.layout.coordinate.get(TP, 0)
        keys = [n[len("shard_"):-len(".pt")] for n in files if n.startswith("shard_")]
        keys = [k for k in keys if _coordinate(k).get(TP, 0) == mine]
        keys.sort(key=lambda k: tuple(_coordinate(k).values()))
        return [load_file(d / f"shard_{k}.pt") for k in keys]

    def _check_can_read(self, d: Path, what: Contents) -> None:
        """One line naming what wrote the checkpoint, where this run's engines cannot read it."""
        if what.model == SHARDED and not hasattr(self.model, "load_sharded_state_dict"):
            raise CheckpointError(
                f"checkpoint {d} was written by strategy={what.strategy}, which keeps the model in per-rank "
                f"shards only; strategy={self.strategy} needs the whole model: resume with one of "
                f"{', '.join(FSDP_STRATEGIES)} (any number of processes), or start a new run")
        sharded_files = what.model == SHARDED or what.optimizer == SHARDED
        if sharded_files and what.tp != self.layout.size(TP):
            raise CheckpointError(
                f"checkpoint {d} was written by strategy={what.strategy} at strategy.tp_size={what.tp}, in shards "
                f"per tensor-parallel slice; resume with strategy.tp_size={what.tp}")

    def _load_model_and_optimizer(self, d: Path, files: dict, what: Contents) -> str:
        model, opt = self.model, self.optimizer
        if what.model == SHARDED:  # an engine's own shards: it reshards them to this layout
            model.load_sharded_state_dict(self._shards(d, files, what), optimizer=opt)
            return ""
        whole = load_file(d / "model.pt")
        if what.legacy:  # the whole optimizer state by position, before names
            whole = {"model": whole["model"]} | (
                {"optimizer": portable.optimizer_from_positions(whole["optimizer"], unwrap(model))}
                if "optimizer" in whole else {})
        if hasattr(opt, "load_sharded_state_dict"):  # ZeRO-1: its own shards, or nothing it can read
            portable.load_whole(model, None, whole, self.layout)
            if what.optimizer == SHARDED:
                opt.load_sharded_state_dict(self._shards(d, files, what))
                return ""
            return self._fresh_optimizer(what, "whole")
        if what.optimizer == SHARDED:
            portable.load_whole(model, None, whole, self.layout)
            return self._fresh_optimizer(what, "in ZeRO-1's shards")
        portable.load_whole(model, opt, whole, self.layout)
        return ""

    def _fresh_optimizer(self, what: Contents, saved_as: str) -> str:
        return (f"the optimizer state starts afresh: strategy={what.strategy} saved it {saved_as}, which "
                f"strategy={self.strategy} cannot read (the weights, step and data position are resumed)")

    def _check_model_matches(self, d: Path, files: dict, what: Contents) -> None:
        """Name the first differing parameters instead of torch's cut-off 'Error(s) in loading state_dict'."""
        saved = what.shapes if what.shapes is not None else _legacy_shapes(d, files, what)
        if saved is None:
            return  # an engine format this module does not know: the engine's loader judges
        ours = self.shapes
        diffs = [f"'{k}' {saved.get(k, 'missing')} in the checkpoint vs {ours.get(k, 'missing')} in the model"
                 for k in sorted(saved.keys() | ours.keys()) if saved.get(k) != ours.get(k)]
        if diffs:
            more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
            raise CheckpointError(f"checkpoint {d} does not match the configured model: {'; '.join(diffs[:3])}{more}; "
                                  f"resume with the model settings in the run's .hydra/config.yaml, or start a new run")


def _legacy_shapes(d: Path, files: dict, what: Contents) -> dict[str, tuple[int, ...]] | None:
    """The whole model's shapes in a checkpoint written before the layout record."""
    if what.model == WHOLE:
        return {k: tuple(v.shape) for k, v in load_file(d / "model.pt")["model"].items()}
    first = load_file(d / min((n for n in files if n.startswith("shard_")), key=lambda n: int(n[8:-3])))
    try:  # flat-shard FSDP's format: {"params": {fqn: {"global_shape"}}, "aliases", "buffers"}
        params = {k: tuple(v["global_shape"]) for k, v in first["params"].items()}
        return params | {a: params[k] for a, k in first["aliases"].items()} | {
            k: tuple(v.shape) for k, v in first["buffers"].items()}
    except (KeyError, TypeError, AttributeError):
        return None
