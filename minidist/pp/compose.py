"""The pipeline with the other dimensions: data-parallel engines per stage, shared weights, clipping.

    stage = Stage(module, s, S, runner=DDP(module, mesh=layout["dp"]), sync=gradient_sync(ddp))
    ...
    pipe.step(x, target=y)
    clip_grad_norm_(pipe, max_norm, layout)       # the norm over every stage, every shard, every slice

Data parallelism over a pipeline: each stage's module is wrapped by its own engine over the
"dp" sub-mesh (the ranks holding the same stage of different pipelines). A step runs m
backwards per stage; only the last may reduce, or the gradients would cross the wire m times:
`gradient_sync(engine)` is the context the runtime runs each backward in (Stage.sync), given
whether it is the stage's last. ZeRO and FSDP read no_sync() when a backward starts: every
backward but the last runs inside it (FSDP's reduce_scatter then runs once per step, on the
summed unsharded gradients). DDP decides in the forward, and the forwards of a pipeline are not
followed by their own backwards: it is told before each backward instead
(DDP.set_requires_gradient_sync).

Shared weights (Cut.ties): the two copies' gradients are exchanged and added by the two ranks
holding them, one send and one receive each (an all_reduce of two ranks), after the engines'
reductions: p.grad then holds the data-parallel average of both uses on both ranks, which take
the same optimizer step. Under FSDP the copies are sharded alike (same shape, same group), so
the shards add row for row.

Deferred reduction (`deferred(engines)`, Pipeline.defer): ZeRO folds each gradient into its flat
partition in a hook and reduce_scatters it there, where the two copies of a tie sit at
different offsets on two ranks: they must be summed before the reduction, and a backward
cannot wait for its twin inside a hook (the twin's rank is still waiting for this rank's
sends: a deadlock). So every backward of the step accumulates locally (no_sync), the ties are
summed on the local gradients (the sum of the local sums, then reduced, is the reduced sum),
and the engine reduces once after the schedule (ShardedOptimizer.reduce_accumulated). The same
bytes per step; the reduction no longer overlaps the last micro-batch's backward. DDP defers too
under a zero-bubble schedule (zb_h1): its weight gradients come in backwards of their own (BW)
after the backward that ends, so none of them can tell the reducer it is the step's last.

Clipping: the stages hold different parameters, declared split over "pp" by whole parameters
(minidist.pp.stage), so minidist.clip.global_norm sums their squared norms over the
pipeline as it sums slices over "tp" and shards over "dp" (ZeRO's flat shards: over its mesh
dimension). A tied weight's second copy is left out of the norm (it holds the same gradient as
the first) and scaled with the rest.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from minidist import clip, comm
from minidist.ddp import DDP
from minidist.fsdp import FSDP
from minidist.mesh import Layout
from minidist.pp.schedule import Schedule
from minidist.pp.stage import PP, GradSync, Stage, Tie
from minidist.zero import ShardedOptimizer


def no_engine(last: bool) -> contextlib.AbstractContextManager[None]:
    """A stage without a data-parallel engine: nothing to decide."""
    return contextlib.nullcontext()


def gradient_sync(engine: DDP | FSDP | ShardedOptimizer) -> GradSync:
    """The Stage.sync of a stage whose gradients `engine` reduces: only the stage's last backward reduces."""
    if isinstance(engine, DDP):
        def tell_ddp(last: bool) -> contextlib.AbstractContextManager[None]:
            engine.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        return tell_ddp
    if isinstance(engine, (FSDP, ShardedOptimizer)):
        return lambda last: contextlib.nullcontext() if last else engine.no_sync()
    raise TypeError(f"gradient_sync: no rule for {type(engine).__name__}; pass minidist.DDP, minidist.FSDP or a "
                    f"minidist.ShardedOptimizer (or Stage.sync=None for a stage without one)")


@dataclass(frozen=True)
class Deferred:
    """An engine's reduction moved after the schedule (module docstring): each backward runs in `sync`,
    a tie's local gradient is `grad_of(p)`, and `reduce()` reduces the step's sums once."""

    sync: GradSync
    grad_of: Callable[[torch.nn.Parameter], torch.Tensor]
    reduce: Callable[[], None]


def deferred(engines: Sequence[ShardedOptimizer | DDP]) -> Deferred:
    """Every backward local, one reduce_accumulated() per engine after the ties are summed: ZeRO's one
    optimizer over the rank's stages, or each stage's DDP under a zero-bubble schedule (its weight
    gradients come in later backwards of their own: no backward can know it is the step's last)."""
    if len(engines) == 1 and isinstance(engines[0], ShardedOptimizer):
        opt = engines[0]
        return Deferred(lambda last: opt.no_sync(), opt.accumulated_grad, opt.reduce_accumulated)
    if engines and all(isinstance(e, DDP) for e in engines):
        def local(last: bool) -> contextlib.AbstractContextManager[None]:
            for e in engines:
                e.set_requires_gradient_sync(False)
            return contextlib.nullcontext()

        def reduce() -> None:
            for e in engines:
                e.reduce_accumulated()
        return Deferred(local, plain_grad, reduce)
    raise TypeError(f"deferred: no rule for {[type(e).__name__ for e in engines]}; pass one minidist.ShardedOptimizer "
                    f"or the stages' minidist.DDP engines")


def plain_grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    """A tie's gradient where the engines leave it: p.grad."""
    return p.grad


def _tied_grad(stage: Stage, name: str, grad_of) -> torch.Tensor:
    p = dict(stage.module.named_parameters(remove_duplicate=False)).get(name)
    grad = None if p is None else grad_of(p)
    if grad is None:
        raise RuntimeError(f"stage {stage.index}: the tied weight {name} has no gradient after backward to sum "
                           f"with its copy")
    return grad


def sync_ties(ties: Sequence[Tie], stages: dict[int, Stage], schedule: Schedule, group, rank: int,
              grad_of: Callable[[torch.nn.Parameter], torch.Tensor | None] = plain_grad) -> None:
    """Sum each tied weight's two gradients (`grad_of` each copy, added to in place) on the two ranks
    holding them (module docstring)."""
    for tie in ties:
        (s1, n1), (s2, n2) = tie.first, tie.second
        r1, r2 = schedule.rank_of(s1), schedule.rank_of(s2)
        if r1 == r2 or rank not in (r1, r2):
            continue  # one rank holds both uses of one Parameter: autograd summed them
        mine, peer = ((s1, n1), r2) if rank == r1 else ((s2, n2), r1)
        grad = _tied_grad(stages[mine[0]], mine[1], grad_of)
        theirs = torch.empty_like(grad)
        ops = [comm.P2POp(comm.isend, grad.detach().clone(), peer, group), comm.P2POp(comm.irecv, theirs, peer, group)]
        for work in comm.batch_isend_irecv(ops):
            work.wait()
        grad.add_(theirs)  # a + b on one rank, b + a on the other: the same bits


def norm_parameters(stages: dict[int, Stage], ties: Sequence[Tie], schedule: Schedule) -> list[torch.Tensor]:
    """This rank's parameters that count in the gradient norm: all but the second copy of a tie across ranks."""
    skip = {(t.second[0], t.second[1]) for t in ties if schedule.rank_of(t.first[0]) != schedule.rank_of(t.second[0])}
    return [p for s in sorted(stages) for n, p in stages[s].module.named_parameters() if (s, n) not in skip]


@torch.no_grad()
def clip_grad_norm_(pipeline, max_norm: float, layout: Layout, norm_type: float = 2.0,
                    optimizer: ShardedOptimizer | None = None) -> torch.Tensor:
    """Scale every gradient of `pipeline` (a minidist.pp.Pipeline) so the whole model's norm is at most max_norm.

    The norm is global_norm over the layout (module docstring); every rank of the world forms
    the same groups of dimensions, whichever kinds of parameter its own stages hold. `optimizer`:
    the ShardedOptimizer that holds the averaged gradients (ZeRO: p.grad is None), else p.grad.
    """
    counted = {id(p) for p in norm_parameters(pipeline.stages, pipeline.ties, pipeline.schedule)}
    also: tuple[str, ...] = ()
    if optimizer is not None:
        pieces, sharded = optimizer.grad_pieces()
        also = (optimizer.mesh_dim,) if sharded else ()
        every = [(p, None) for p in optimizer.parameters_in_order] + pieces  # the same groups on every rank
    else:
        every = [(p, p.grad) for p in pipeline.parameters()]
    groups = clip.norm_groups(((p, g) for p, g in every if id(p) in counted), also)
    covered = {d for a in also for d in layout.root_dims(a)}
    others = [d for d in layout.names if d != PP and d not in covered] + list(also)
    for k in range(len(others) + 1):
        for dims in itertools.combinations(others, k):
            groups.setdefault(tuple(sorted({*dims, PP})), [])
    total = clip.global_norm(groups, layout, layout.device, float(norm_type))
    clip.scale_([g for _, g in every if g is not None], max_norm, total)
    return total
