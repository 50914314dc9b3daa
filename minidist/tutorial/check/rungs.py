"""The rungs of the build-it track, and running a rung's checks against a learner's file.

    run_checks("ddp_bucketed", "mine.py")   # on every rank of an initialised process group
    -> [("equal to one process", True, "after 3 SGD steps ..."), ...]   the same list on every rank

The learner's file is imported as a module of its own (any path, any name), on every rank. Each
check runs on every rank in the same order; its verdict is the same everywhere because every
number it rests on is reduced over the ranks first. A check that raises on every rank (a stub's
NotImplementedError) fails with the error's line in the learner's file, and the next check runs;
a check that raised on some ranks only may have left the others inside a collective, so the rest
are not run (the process group's timeout bounds the wait).
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist

from minidist.tutorial.check import cp, ddp, fsdp, pp, tp, zero
from minidist.tutorial.check.verdict import Check

TUTORIAL = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Rung:
    name: str
    title: str
    solution: str
    """The track's own file, minidist/tutorial/<solution>.py: it passes every check."""
    page: str
    """The docs page that states the problem."""
    names: tuple[str, ...]
    """What the learner's file must define."""
    checks: tuple[Check, ...]

    @property
    def stub(self) -> Path:
        return TUTORIAL / "exercises" / f"{self.name}.py"

    @property
    def solution_path(self) -> Path:
        return TUTORIAL / f"{self.solution}.py"


RUNGS = {r.name: r for r in (
    Rung("ddp_naive", "DDP 1: a blocking all_reduce per parameter", "ddp_naive", "docs/tutorial/ddp.md",
         ("NaiveDDP",), ddp.CHECKS["ddp_naive"]),
    Rung("ddp_flat", "DDP 2: one flat all_reduce", "ddp_flat", "docs/tutorial/ddp.md", ("FlatDDP",),
         ddp.CHECKS["ddp_flat"]),
    Rung("ddp_overlap", "DDP 3: async all_reduces from gradient hooks", "ddp_overlap", "docs/tutorial/ddp.md",
         ("OverlapDDP",), ddp.CHECKS["ddp_overlap"]),
    Rung("ddp_bucketed", "DDP 4: buckets", "ddp_bucketed", "docs/tutorial/ddp.md", ("BucketedDDP",),
         ddp.CHECKS["ddp_bucketed"]),
    Rung("zero1", "ZeRO-1 as the paper does it: reduce_scatter, step, all_gather", "zero1",
         "docs/tutorial/sharded_optimizer.md", ("ShardedOptimizer",), zero.CHECKS["zero1"]),
    Rung("sharded_optimizer", "ZeRO-1, owner-broadcast (CS336's exercise)", "sharded_optimizer",
         "docs/tutorial/sharded_optimizer.md", ("ShardedOptimizer",), zero.CHECKS["sharded_optimizer"]),
    Rung("fsdp", "FSDP per parameter, with a compute dtype", "fsdp", "docs/tutorial/fsdp.md", ("FSDP",),
         fsdp.CHECKS["fsdp"]),
    Rung("tp", "Tensor parallelism: column- and row-parallel Linear", "tp", "docs/tutorial/tp.md",
         ("CopyToTP", "ReduceFromTP", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP"), tp.CHECKS["tp"]),
    Rung("pp", "Pipeline parallelism: GPipe and 1F1B over send and recv", "pp", "docs/tutorial/pp.md",
         ("Pipeline",), pp.CHECKS["pp"]),
    Rung("cp", "Context parallelism: ring attention with the online softmax", "cp", "docs/tutorial/cp.md",
         ("ring_attention",), cp.CHECKS["cp"]),
)}
"""In the track's reading order."""


def load(path: str | Path, rung: Rung) -> ModuleType:
    """The learner's file as a fresh module (ImportError naming what is missing)."""
    path = Path(path).resolve()
    name = f"_learner_{rung.name}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    missing = [n for n in rung.names if not hasattr(module, n)]
    if missing:
        raise ImportError(f"{path.name} defines no {', '.join(missing)} (rung {rung.name} needs {', '.join(rung.names)};"
                          f" start from {rung.stub.relative_to(TUTORIAL.parents[1])})")
    return module


def describe(exc: BaseException, path: Path) -> str:
    """One line: the error, and the last line of the learner's file it passed through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    where = f" ({path.name}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}{where}"


def run_checks(rung_name: str, path: str) -> list[tuple[str, bool, str]]:
    """Every check of the rung on the learner's file, on the current process group: (name, passed, detail)."""
    rung, path = RUNGS[rung_name], Path(path).resolve()
    module = load(path, rung)
    out: list[tuple[str, bool, str]] = []
    for i, check in enumerate(rung.checks):
        torch.manual_seed(0)
        raised = 0
        try:
            verdict = check.run(module)
            ok, detail = verdict.ok, verdict.detail
        except Exception as exc:  # noqa: BLE001 - the learner's code: any error is a failed check
            ok, detail, raised = False, describe(exc, path), 1
        flag = torch.tensor([raised])
        dist.all_reduce(flag)
        out.append((check.name, ok, detail))
        if 0 < int(flag) < dist.get_world_size():
            out += [(c.name, False, "not run: an earlier check raised on some ranks only, so the ranks may no "
                     "longer agree on their collectives") for c in rung.checks[i + 1:]]
            break
    return out
