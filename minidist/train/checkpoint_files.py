"""A checkpoint directory's files: written durably, verified by sha256, and what COMPLETE says they hold.

minidist.train.checkpoint decides what each rank writes and reads; this module is the
format underneath: how a file reaches the disk so that a crash cannot leave a marked
checkpoint with missing bytes, how a bad file is named, the RNG states, and the record
of what wrote a checkpoint (its strategy and mesh, what is whole and what sharded, the
whole model's shapes), read back from COMPLETE or inferred for checkpoints written
before the record existed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from minidist.mesh import DATA_PARALLEL_DIMS, PP, TP, Layout
from minidist.runtime import UsageError

MARKER = "COMPLETE"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and the reason."""


class CheckpointRefused(CheckpointError, UsageError):
    """A sound checkpoint this run's settings cannot read (another model, a layout its engines cannot load):
    a bad input, the same on every rank (runtime.UsageError: one line, exit 64), decided before any write."""


# ------------------------------------------------------------------------------ files
def fsync_dir(d: Path) -> None:
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
    fsync_dir(path.parent)


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

    @property
    def pp(self) -> int:
        return dict(zip(self.dims, self.shape)).get(PP, 1)

    def label(self) -> str:
        """What wrote it, as the curves and the log name a layout: "ddp at 2 ranks" (layout_label)."""
        return self.strategy if self.legacy else layout_label(self.strategy, self.dims, self.shape)

    def record(self) -> dict:
        return {"strategy": self.strategy, "dims": list(self.dims), "shape": list(self.shape), "model": self.model,
                "optimizer": self.optimizer, "shapes": {k: list(v) for k, v in (self.shapes or {}).items()}}


def layout_label(strategy: str, dims: tuple[str, ...], shape: tuple[int, ...]) -> str:
    """"full_shard at 4 ranks (tp 2)": a strategy and its mesh, as a resumed run's log and curves name them
    (every dimension but the data-parallel ones: "ddp at 4 ranks (cp 2, tp 2)")."""
    world = 1
    for n in shape:
        world *= n
    inner = ", ".join(f"{d} {n}" for d, n in zip(dims, shape) if d not in DATA_PARALLEL_DIMS and n > 1)
    return f"{strategy} at {world} rank{'s' if world > 1 else ''}" + (f" ({inner})" if inner else "")


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
    return Contents(_strategy_of_run(d) or ("an FSDP strategy" if model == SHARDED else "a ZeRO strategy" if shards
                                            else "single or ddp"), (), (), model, optimizer, None, legacy=True)


def _strategy_of_run(d: Path) -> str | None:
    """strategy.name in the run's .hydra/config.yaml (<run>/checkpoints/step_N/), if it says."""
    try:
        text = (d.parent.parent / ".hydra" / "config.yaml").read_text()
    except OSError:
        return None
    m = re.search(r"^strategy:\n(?:  .*\n)*?  name: (\S+)", text, re.M)
    return m.group(1) if m else None


def coordinate(file_key: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"([a-z]+)(\d+)", file_key)}



def legacy_shapes(d: Path, files: dict, what: Contents) -> dict[str, tuple[int, ...]] | None:
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
