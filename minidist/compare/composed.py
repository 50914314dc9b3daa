"""What a measured row's composed dimension looks like on this rank: its tensor, context or pipeline parallelism.

    raw["tp"] = tensor_parallel(cfg, bench)     # None for a row without it
    raw["cp"] = context_parallel(bench)
    raw["pp"] = pipeline(bench, timelines)

`bench` is minidist.compare.measure's Bench: the model as the trainer composed it, its layout, its
strategy config. Each function records plain JSON, what minidist.compare.analysis needs to build the
row's calls (the sliced model's parameters, a cp group's sequences, each pipeline stage's units and
buckets) without holding the model; none issues a collective.
"""

from __future__ import annotations

import itertools

import torch

from minidist.clip import dims_of
from minidist.compare.profile import model_shape
from minidist.mesh import CP, DP, PP, TP
from minidist.pp.compose import norm_parameters
from minidist.pp.stage import split_gpt
from minidist.strategies import contract
from minidist.tp import parallelize_gpt
from minidist.train.task import make_task


def tensor_parallel(cfg, bench) -> dict | None:
    """What the row's tensor parallelism looks like on this rank (None without it): its degree and
    switches, the sliced model's parameters (what the data-parallel engine wraps: each rank's
    slices, built on the meta device over the same tp mesh), and the groups the clip's norm sums
    over (minidist.parallel.parallelize.clip_grad_norm_: one key per set of dimensions that split a
    parameter, read from the parameters' own declarations; ZeRO's sharded gradients add "dp")."""
    layout = bench.layout
    if bench.tp_size == 1:
        return None
    so = bench.strategy_cfg
    with torch.device("meta"):
        model, blocks = make_task(cfg.model).build()
    model = parallelize_gpt(model, layout[TP], sequence_parallel=so.sequence_parallel, vocab_parallel=so.vocab_parallel)
    sliced = model_shape(model, blocks)
    if bench.run.strategy.optimizer_engine is contract.ShardedOptimizerState:
        also = (DP,) if bench.optimizer.grad_pieces()[1] else ()
        keys = {dims_of(p, also) for p in bench.optimizer.parameters_in_order}
    else:
        keys = {dims_of(p) for p in bench.model.parameters()}
    return {"size": bench.tp_size, "dp": layout.dp_size, "batch": bench.batch,
            "sequence_parallel": bool(so.sequence_parallel), "vocab_parallel": bool(so.vocab_parallel),
            "param_numels": list(sliced.param_numels), "param_units": list(sliced.param_units),
            "unit_param_rows": [list(map(list, u)) for u in sliced.unit_param_rows],
            "norm_dims": sorted(list(k) for k in keys)}


def context_parallel(bench) -> dict | None:
    """The row's context parallelism (None without it): its degree, how keys and values travel, and the
    sequences a cp group shares (each rank holds 1/C of their tokens)."""
    size = bench.layout.size(CP)
    if size == 1:
        return None
    return {"size": size, "rotate": bench.strategy_cfg.cp_rotate, "batch": bench.batch}


def pipeline(bench, timelines: list) -> dict | None:
    """The row's pipeline on this rank (None without one): its degree, schedule, micro-batches and this rank's
    coordinates (the pipeline it belongs to: the other dimensions'), and per measured step the runtime's
    timeline (the bubble is measured from it: minidist.compare.analysis)."""
    layout, so = bench.layout, bench.strategy_cfg
    if layout.size(PP) == 1:
        return None
    coordinate, pipe = dict(layout.coordinate), bench.model.pipeline
    rank = coordinate.pop(PP)
    with torch.device("meta"):  # each stage's shape, as its engine wraps it: the whole model cut alike
        model, blocks = make_task(bench.cfg.model).build()
    cut = split_gpt(model, pipe.schedule.num_stages)
    stages = []
    for s in pipe.schedule.stages_of(rank):
        shape, runner = model_shape(cut.modules[s], blocks), pipe.stages[s].runner
        stages.append({"index": s, "unit_param_numels": shape.unit_param_numels, "param_numels": shape.param_numels,
                       "param_units": shape.param_units, "unit_param_rows": shape.unit_param_rows,
                       "buckets": bench.run.strategy.buckets(runner, bench.optimizer)})
    return {"size": layout.size(PP), "dp": layout.dp_size, "schedule": so.pp_schedule,
            "virtual": so.get("pp_virtual", 1), "microbatches": bench.microbatches, "batch": bench.batch,
            "stage_rank": rank, "pipeline": sorted(coordinate.items()), "timelines": timelines,
            "stages": stages, "tie_bytes": sum(_tie_bytes(pipe, tie, rank) for tie in pipe.ties),
            "norm_dims": _norm_dims(pipe, layout)}


def _tie_bytes(pipe, tie, rank: int) -> int:
    """Bytes of this rank's copy of a weight tied across ranks (its gradient goes to the twin: sync_ties); 0 if
    this rank holds neither or both."""
    holders = {pipe.schedule.rank_of(s): (s, name) for s, name in (tie.first, tie.second)}
    if len(holders) == 1 or rank not in holders:
        return 0
    s, name = holders[rank]
    p = dict(pipe.stages[s].module.named_parameters(remove_duplicate=False))[name]
    return p.numel() * p.element_size()


def _norm_dims(pipe, layout) -> list[list[str]]:
    """The clip's groups (minidist.pp.clip_grad_norm_): the dimensions that split each counted parameter, and
    every set of the other dimensions with pp, which every rank forms alike."""
    keys = {dims_of(p) for p in norm_parameters(pipe.stages, pipe.ties, pipe.schedule)}
    others = [d for d in layout.names if d != PP]
    keys |= {tuple(sorted({*dims, PP})) for k in range(len(others) + 1) for dims in itertools.combinations(others, k)}
    return sorted(list(k) for k in keys)
