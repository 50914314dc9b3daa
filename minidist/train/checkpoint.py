"""Checkpoints: every file a run writes to resume, in one module.

    <run dir>/checkpoints/step_0000200/
        model.pt              the whole model, and a plain optimizer's whole state by parameter name
                              (minidist.parallel.portable), written by the main process
        shard_{coord}.pt      the rank at mesh coordinate coord: its engine's sharded state, the
                              model's and its optimizer's (FSDP) or the optimizer's (ZeRO-1)
        state_{coord}.pt      its RNG states, and the step and data position (the same on every rank)
        manifest_{coord}.json sha256 and size of each file it wrote
        COMPLETE              the merged manifest and what wrote it (strategy, mesh, what is whole and
                              what sharded, the whole model's shapes), by the main process, last

coord is the rank's coordinate on every mesh dimension ("dp1", "replicate0_shard1",
"dp0_tp1"), so two ranks that differ in any dimension never write the same file. What goes
where is decided by the contract the strategy's engines offer (its record says which:
minidist.strategies.contract), not by its name: a sharded model (FSDP) saves its shards
together with the optimizer state that belongs to them; otherwise the main process saves the
whole model (tensor-parallel slices gathered first), and a sharded optimizer (ZeRO) saves one
shard per rank. Sharded files are read back from every saved rank of the same tp slice
and the engines cut out what the current layout needs, so a checkpoint written at N
processes resumes at M.

Across strategies: a whole model loads into any strategy (FSDP through its
load_full_state_dict), and a whole optimizer state into any plain optimizer, FSDP's
included (see minidist.parallel.portable); sharded files load into any engine that reads
them (FSDP's into every FSDP strategy, at any world size). Anything else is refused in
one line naming the strategy that wrote the checkpoint (CheckpointRefused: a bad input, exit
64), except an optimizer state that only its own engine reads: the weights are loaded, the
optimizer starts afresh, and the run says so. Checkpoints from before the layout record (files keyed by dp rank) load
as they did.

Why a checksum and fsync: a checkpoint must either load exactly as written or be refused.
Every file is fsync'ed (and its directory) before COMPLETE exists, so a power cut cannot leave
a marked checkpoint with missing bytes; every file's sha256 is verified before torch.load
sees it, so a flipped bit or a truncated file is named and skipped (the newest checkpoint
that verifies is used) instead of resuming with wrong weights. Everything is loaded with
weights_only=True: tensors and plain values, never pickled objects.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.nn as nn

from minidist import comm
from minidist.mesh import PP, TP, Layout
from minidist.parallel import portable
from minidist.parallel.parallelize import unwrap
from minidist.strategies import contract, get, records
from minidist.train.checkpoint_files import (MARKER, SHARDED, WHOLE, WITH_MODEL, CheckpointError, CheckpointRefused,
                                             Contents, contents, coordinate, fsync_dir, legacy_shapes, load_file,
                                             rng_state, save_file, set_rng_state, verify, write_bytes_durably)

__all__ = ["Checkpointer", "CheckpointError", "CheckpointRefused", "MARKER"]

# ------------------------------------------------------------------------ checkpointer
class Checkpointer:
    """Saves, verifies and loads the checkpoints of one run directory (the same path on every rank).

    shapes: the whole model's state_dict shapes (before any wrapper), recorded so that a
    changed model is named without opening an engine's files; strategy: its name (its record says
    which contract the engines offer: what is saved whole and what in shards).
    """

    def __init__(self, run_dir: Path, keep_last: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 layout: Layout, *, shapes: dict[str, tuple[int, ...]], strategy: str):
        self.root = run_dir / "checkpoints"
        self.keep_last = max(1, keep_last)
        self.model, self.optimizer, self.layout = model, optimizer, layout
        self.shapes, self.strategy = {k: tuple(v) for k, v in shapes.items()}, strategy
        self.record = get(strategy)
        self.sharded_model = self.record.model_engine is contract.ShardedModel
        self.sharded_optimizer = self.record.optimizer_engine is contract.ShardedOptimizerState
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
            fsync_dir(self.root)
            for old in self.complete()[:-self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        comm.barrier()  # nobody resumes from / deletes a directory others still read
        return final

    def _save_model_and_optimizer(self, d: Path) -> tuple[dict, tuple[str, str]]:
        """This rank's files, and where the model and the optimizer state went (WHOLE / SHARDED / WITH_MODEL)."""
        model, opt, files = self.model, self.optimizer, {}
        shard = f"shard_{self.layout.key}.pt"
        if self.sharded_model:
            files[shard] = save_file(model.sharded_state_dict(optimizer=opt), d / shard)
            return files, (SHARDED, WITH_MODEL)
        if self.sharded_optimizer:
            files[shard] = save_file(opt.sharded_state_dict(), d / shard)
        whole = portable.whole_state(model, None if self.sharded_optimizer else opt, self.layout,
                                     self.record)  # a collective
        if self.main:
            files["model.pt"] = save_file(whole, d / "model.pt")
        return files, (WHOLE, SHARDED if self.sharded_optimizer else WHOLE)

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
        (and "note": what could not be carried over, for the run's log, "" when everything was;
        "written_by": the strategy and mesh that wrote it, Contents.label).

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
        return state | {"note": note, "written_by": what.label()}

    def _shards(self, d: Path, files: dict, what: Contents) -> list[dict]:
        """Every saved rank's shard file of this rank's tp slice and pipeline stages, in coordinate order."""
        mine = {d: self.layout.coordinate.get(d, 0) for d in (TP, PP)}
        keys = [n[len("shard_"):-len(".pt")] for n in files if n.startswith("shard_")]
        keys = [k for k in keys if all(coordinate(k).get(d, 0) == c for d, c in mine.items())]
        keys.sort(key=lambda k: tuple(coordinate(k).values()))
        return [load_file(d / f"shard_{k}.pt") for k in keys]

    def _check_can_read(self, d: Path, what: Contents) -> None:
        """One line naming what wrote the checkpoint, where this run's engines cannot read it."""
        if what.model == SHARDED and not self.sharded_model:
            raise CheckpointRefused(
                f"checkpoint {d} was written by strategy={what.strategy}, which keeps the model in per-rank "
                f"shards only; strategy={self.strategy} needs the whole model: resume with one of "
                f"{', '.join(r.name for r in records() if r.model_engine is contract.ShardedModel)} (any number "
                f"of processes), or start a new run")
        sharded_files = what.model == SHARDED or what.optimizer == SHARDED
        if sharded_files and what.tp != self.layout.size(TP):
            raise CheckpointRefused(
                f"checkpoint {d} was written by strategy={what.strategy} at strategy.tp_size={what.tp}, in shards "
                f"per tensor-parallel slice; resume with strategy.tp_size={what.tp}")
        if sharded_files and what.pp != self.layout.size(PP):
            raise CheckpointRefused(
                f"checkpoint {d} was written by strategy={what.strategy} at strategy.pp_size={what.pp}, in shards "
                f"per pipeline stage; resume with strategy.pp_size={what.pp} (or from a ddp run's whole model)")

    def _load_model_and_optimizer(self, d: Path, files: dict, what: Contents) -> str:
        model, opt = self.model, self.optimizer
        if what.model == SHARDED:  # an engine's own shards: it reshards them to this layout
            model.load_sharded_state_dict(self._shards(d, files, what), optimizer=opt)
            return ""
        whole = load_file(d / "model.pt")
        if what.legacy:  # the whole optimizer state by position, before names
            whole = {"model": whole["model"]} | (
                {"optimizer": portable.optimizer_from_positions(whole["optimizer"], unwrap(model, self.record))}
                if "optimizer" in whole else {})
        if self.sharded_optimizer:  # ZeRO: its own shards, or nothing it can read
            portable.load_whole(model, None, whole, self.layout, self.record)
            if what.optimizer == SHARDED:
                opt.load_sharded_state_dict(self._shards(d, files, what))
                return ""
            return self._fresh_optimizer(what, "whole")
        if what.optimizer == SHARDED:
            portable.load_whole(model, None, whole, self.layout, self.record)
            return self._fresh_optimizer(what, "in ZeRO-1's shards")
        portable.load_whole(model, opt, whole, self.layout, self.record)
        return ""

    def _fresh_optimizer(self, what: Contents, saved_as: str) -> str:
        return (f"the optimizer state starts afresh: strategy={what.strategy} saved it {saved_as}, which "
                f"strategy={self.strategy} cannot read (the weights, step and data position are resumed)")

    def _check_model_matches(self, d: Path, files: dict, what: Contents) -> None:
        """Name the first differing parameters instead of torch's cut-off 'Error(s) in loading state_dict'."""
        saved = what.shapes if what.shapes is not None else legacy_shapes(d, files, what)
        if saved is None:
            return  # an engine format this module does not know: the engine's loader judges
        ours = self.shapes
        diffs = [f"'{k}' {saved.get(k, 'missing')} in the checkpoint vs {ours.get(k, 'missing')} in the model"
                 for k in sorted(saved.keys() | ours.keys()) if saved.get(k) != ours.get(k)]
        if diffs:
            more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
            raise CheckpointRefused(f"checkpoint {d} does not match the configured model: {'; '.join(diffs[:3])}"
                                    f"{more}; resume with the model settings in the run's .hydra/config.yaml, or "
                                    f"start a new run")
