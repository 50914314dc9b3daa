"""From every rank's raw measurements of one strategy to one row of the comparison.

Bytes per step, the mean over ranks (a broadcast is sent by N-1 of N ranks; minidist.comm.trace):

    trace      what minidist.comm.trace counts under the ring model (sent_bytes)
    wire       the same for the collective the backend really runs (gloo's own reduce_scatter
               is an all_reduce; minidist's ring on gloo is not)
    kernel     what the kernel counted this process writing (comm.kernel_io, /proc/self/io), on
               gloo; elsewhere None ("not measured": NCCL moves bytes the kernel does not see)
    formula    the textbook formulas applied call by call to the model's shape (analytic.plan: the
               strategy's record's collectives; a
               tensor-parallel row `<strategy>+tp<T>`: minidist.tp.cost's calls plus the
               strategy's over the sliced model, as measure.tensor_parallel recorded it; a
               pipeline row `<strategy>+pp<P>`: each rank's own stage, the schedule's messages
               (analytic.pipeline_calls), the mean over ranks as the trace's)

Time (medians over the measured steps, their spread the interquartile range; a step's time is
the slowest rank's):

    step       the trainer's step (minidist.train.trainer.train_step)
    baseline   the same step of the plain model: no wrapper, no communication
    overhead   step - baseline: what the strategy adds (exposed communication and engine work)
    alone      the step's collectives alone (replay.py): per call the median of its repeats,
               summed; the mean over ranks (nccl-tests' default)
    hidden     minidist.comm.trace.hidden_share(overhead, alone): the one definition
    predicted  the alpha-beta ring prediction (calibrated alpha, beta) of the collectives the
               backend runs, and its error against `alone`
    blocked    main-thread time inside collective calls and waits (the trace; not "hidden")
    bubble     a pipeline row's share of the step not computing, from the runtime's own timelines
               (bubble()), beside its schedule's formula (minidist.pp.cost.bubble)
    in step    the trace's wire time of the step's collectives (minidist.comm.trace.wire_times, from
               the last member's issue), the mean over ranks: against `alone`, what running inside
               the step (sharing the cores with compute, several collectives at once) cost
    algbw      per op, payload / time alone; busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n
               (all_gather, reduce_scatter), 1 (broadcast): nccl-tests' definitions; calls on one-rank
               groups (a tp2 row's data-parallel group at world 2) are left out of both

Memory (the rank with the largest peak): the allocator's peak (minidist.compare.allocator: torch's
profiler on the CPU, the CUDA allocator on a GPU), the ledger's split of its own peak by role,
and the estimate (minidist.compare.estimate) with its error against the allocator's peak (a
tensor-parallel row: None, "not estimated"; the engines' footprints describe data parallelism only).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from minidist import strategies
from minidist.comm import CostModel, hidden_share
from minidist.comm.trace import arrivals, wire_times
from minidist.compare import intervals
from minidist.compare.analytic import (CP_CLOSED_FORM, TP_CLOSED_FORM, ContextParallel,
                                       PipelineParallel, TensorParallel, busbw_factor, closed_form, pipeline_calls,
                                       plan, ring_bytes)
from minidist.compare.estimate import estimate_memory
from minidist.compare.profile import StepProfile
from minidist.mesh import CP, DATA_PARALLEL_DIMS, SHARD
from minidist.shape import ModelShape
from minidist.strategies import Wire


def spread(xs: list[float]) -> dict[str, float]:
    """Median, quartiles, min and max of `xs`."""
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": xs[0], "max": xs[-1]}


def _step_times(per_rank: list[list[list[float]]]) -> list[float]:
    """Per step, the slowest rank's duration."""
    return [max(b - a for a, b in steps) for steps in zip(*per_rank)]


def _bytes(raws: list[dict], steps: int, formula: float) -> dict:
    n = len(raws)
    mean = lambda key: sum(r[key] for raw in raws for r in raw["records"]) / n / steps  # noqa: E731
    kernel = [raw["kernel_bytes"] for raw in raws]
    out = {"payload": sum(r["payload_bytes"] for r in raws[0]["records"]) / steps, "trace": mean("sent_bytes"),
           "wire": mean("wire_bytes"), "formula": formula,
           "kernel": None if None in kernel else sum(kernel) / n / steps,
           "kernel_per_rank": None if None in kernel else [k / steps for k in kernel]}
    out["kernel_error"] = None if out["kernel"] is None or not out["wire"] else out["kernel"] / out["wire"] - 1
    return out


def _alone(raws: list[dict], cost: CostModel) -> dict:
    """The replayed step: total, per op (time, algbw, busbw), the prediction."""
    calls = [raw["alone"]["calls"] for raw in raws]
    repeats = len(calls[0][0]["seconds"]) if calls[0] else 0
    per_call = [statistics.mean(statistics.median(rank[i]["seconds"]) for rank in calls) for i in range(len(calls[0]))]
    rounds = [statistics.mean(sum(c["seconds"][k] for c in rank) for rank in calls) for k in range(repeats)]
    ops: dict[str, dict] = defaultdict(lambda: {"calls": 0, "payload": 0, "bus": 0.0, "seconds": 0.0, "predicted": 0.0})
    for c, t in zip(calls[0], per_call):
        if c["group_size"] <= 1:  # a one-rank group moves nothing and takes no time: not a bandwidth sample
            continue
        o = ops[c["op"]]
        o["calls"] += 1
        o["payload"] += c["payload_bytes"]
        o["bus"] += c["payload_bytes"] * busbw_factor(c["op"], c["group_size"])
        o["seconds"] += t
        o["predicted"] += cost.predict(c["wire_op"], c["payload_bytes"], c["group_size"], "ring")
    for o in ops.values():
        o["algbw_GBps"] = o["payload"] / o["seconds"] / 1e9 if o["seconds"] > 0 else None
        o["busbw_GBps"] = o["bus"] / o["seconds"] / 1e9 if o["seconds"] > 0 else None
    total = sum(per_call)
    predicted = sum(o["predicted"] for o in ops.values())
    return {"seconds": total, "spread": spread(rounds) if rounds else None, "ops": dict(ops),
            "predicted": predicted, "error": predicted / total - 1 if total > 0 else None, "repeats": repeats}


def _blocked(raw: dict) -> float:
    """Main-thread seconds per step inside collective calls or waits (the trace)."""
    sync = [(r["issued"], r["completed"] if not r["async_op"] else r["launched"]) for r in raw["records"]
            if r["completed"] is not None]
    return intervals.length(sync + [tuple(w) for w in raw["main_waits"]]) / max(1, len(raw["steps"]))


def _in_step_wire(raws: list[dict]) -> float:
    """Seconds per step on the wire inside the measured steps (trace.wire_times with every rank's arrivals)."""
    arrived = arrivals([[(r["group"], r["issued"]) for r in raw["records"]] for raw in raws])
    total = sum(w or 0.0 for raw, arr in zip(raws, arrived)
                for w in wire_times([(r["group"], r["issued"], r["completed"]) for r in raw["records"]], arr))
    return total / len(raws) / max(1, len(raws[0]["steps"]))


def _time(raws: list[dict], alone: dict) -> dict:
    step = spread(_step_times([r["steps"] for r in raws]))
    base = spread(_step_times([r["baseline"]["steps"] for r in raws]))
    sends = raws[0]["world"] > 1  # a world of one sends nothing (its collectives copy locally): no share of it
    out = {"step": step, "baseline": base, "overhead": step["median"] - base["median"], "alone": alone["seconds"],
           "hidden": hidden_share(step["median"] - base["median"], alone["seconds"]) if sends else None,
           "predicted": alone["predicted"], "predicted_error": alone["error"] if sends else None,
           "blocked": statistics.mean(_blocked(r) for r in raws), "in_step_wire": _in_step_wire(raws)}
    phases: dict[str, list[float]] = defaultdict(list)
    for name, _, a, b in raws[0]["baseline"]["phases"]:
        phases[name].append(b - a)
    out["baseline_phases"] = {k: statistics.median(v) for k, v in phases.items()}
    return out


def _memory(raws: list[dict], prof: StepProfile | None, strategy_cfg, cfg) -> dict:
    measured = [r["memory"] for r in raws if r["memory"]]
    if not measured:
        return {}
    worst = max(range(len(measured)), key=lambda i: measured[i]["allocator"] or 0)
    m = measured[worst]
    out = {"allocator": m["allocator"], "instrument": m["instrument"], "ledger": m["ledger"], "by_role": m["by_role"],
           "where": m["where"], "rank": raws[worst]["rank"],
           "ledger_error": m["ledger"] / m["allocator"] - 1 if m["allocator"] else None}
    out["estimate"] = None  # "not estimated": the engines' footprints do not describe a tensor-parallel model
    if prof is not None:
        est = estimate_memory(prof, strategy_cfg, raws[0]["world"], device=raws[0]["device"], optimizer=cfg.optim.name,
                              backend=raws[0]["backend"], group=state_group(raws[0]))
        out["estimate"] = {"total": est.total, "by_role": est.by_role, "where": est.where}
        out["error"] = est.total / m["allocator"] - 1 if m["allocator"] else None
    return out


def state_group(raw: dict) -> int:
    """The ranks a measured run split its states over, from the mesh it used: its "shard" dimension
    (hybrid sharding's group), else every data-parallel rank times cp (the engine spans dp x cp)."""
    dims, shape = raw["mesh"]["dims"], raw["mesh"]["shape"]
    if SHARD in dims:
        return shape[dims.index(SHARD)]
    return math.prod(n for d, n in zip(dims, shape) if d in DATA_PARALLEL_DIMS + (CP,))


def tensor_parallel_of(raw: dict, shape: ModelShape, cfg) -> tuple[ModelShape, Wire, TensorParallel | None]:
    """A row's model shape for the formulas, how its engine moved it (the buckets as built) and its tensor
    parallelism: the plain model's and None without TP; with it, the sliced model's parameters (as
    measure.tensor_parallel recorded them) and the GPT plan's collectives for the batch a tp group shares."""
    t = raw.get("tp")
    wire = Wire(tuple(raw["bucket_numels"]))
    if not t:
        return shape, wire, None
    rows = tuple(tuple(tuple(r) for r in u) for u in t["unit_param_rows"])
    sliced = ModelShape(tuple(tuple(r * c for r, c in u) for u in rows), tuple(t["param_numels"]),
                        tuple(t["param_units"]), shape.itemsize, rows)
    return sliced, wire, TensorParallel.of_gpt(cfg.model, t["batch"], cfg.model.block_size, t["size"], t["dp"],
                                               sequence_parallel=t["sequence_parallel"],
                                               vocab_parallel=t["vocab_parallel"], itemsize=shape.itemsize,
                                               norm_dims=t["norm_dims"])


def context_parallel_of(raw: dict, cfg, itemsize: int) -> ContextParallel | None:
    """A measured context-parallel row's ring (None for any other row): the sequences its cp group shared."""
    c = raw.get("cp")
    return c and ContextParallel.of_gpt(cfg.model, c["batch"], cfg.model.block_size, c["size"], c["rotate"], itemsize)


def pipeline_of(raw: dict, cfg, itemsize: int) -> PipelineParallel | None:
    """A measured pipeline row's pipeline (None for any other row): the sequences each pipeline shared."""
    p = raw.get("pp")
    return p and PipelineParallel.of_gpt(cfg.model, p["batch"], cfg.model.block_size, p["size"], p["dp"],
                                         p["schedule"], p["microbatches"], p["virtual"], itemsize)


def stage_shape(raw: dict, itemsize: int, k: int = 0) -> tuple[ModelShape, Wire]:
    """The shape of a measured pipeline rank's k-th stage (its units, as its engine wrapped them) and its buckets."""
    st = raw["pp"]["stages"][k]
    return (ModelShape(tuple(map(tuple, st["unit_param_numels"])), tuple(st["param_numels"]), tuple(st["param_units"]),
                       itemsize, tuple(tuple(map(tuple, u)) for u in st["unit_param_rows"])), Wire(tuple(st["buckets"])))


def pipeline_rank_calls(raw: dict, record, pp: PipelineParallel, group: int, grad_clip: bool, itemsize: int) -> list:
    """One pipeline rank's calls (analytic.pipeline_calls) for the stages it measured: their shapes and buckets."""
    p = raw["pp"]
    stages = [stage_shape(raw, itemsize, k) for k in range(len(p["stages"]))]
    return pipeline_calls(record, stages, pp, p["stage_rank"], group=group, tie=p["tie_bytes"],
                          norm_dims=p["norm_dims"], grad_clip=grad_clip)


def bubble(raws: list[dict]) -> dict:
    """The bubble measured from the runtime's own timelines (Pipeline.timeline): per pipeline and measured step,
    1 - busy / (P x span), busy the ranks' compute actions, span from the first action's start to the last's end
    on any of the pipeline's ranks (minidist.pp.check.bubble's definition); the median over steps, the mean over
    the pipelines; per stage rank, its own share 1 - busy / span."""
    pipelines: dict[tuple, list[dict]] = defaultdict(list)
    for raw in raws:
        pipelines[tuple(map(tuple, raw["pp"]["pipeline"]))].append(raw)
    whole, per_rank = [], defaultdict(list)
    for members in pipelines.values():
        shares = []
        for k in range(len(members[0]["pp"]["timelines"])):
            lines = {m["pp"]["stage_rank"]: m["pp"]["timelines"][k] for m in members}
            span = max(e for tl in lines.values() for _, _, e in tl) - min(b for tl in lines.values() for _, b, _ in tl)
            busy = {r: sum(e - b for what, b, e in tl if what != "wait") for r, tl in lines.items()}
            shares.append(1 - sum(busy.values()) / (len(lines) * span))
            for r, t in busy.items():
                per_rank[r].append(1 - t / span)
        whole.append(statistics.median(shares))
    return {"measured": statistics.mean(whole), "per_rank": [statistics.median(per_rank[r]) for r in sorted(per_rank)]}


def strategy_row(raws: list[dict], shape: ModelShape, cost: CostModel, prof: StepProfile | None, cfg,
                 strategy_cfg) -> dict:
    """One strategy's measured and predicted numbers (plain JSON; see the module docstring)."""
    r0, steps = raws[0], cfg.steps
    world, group = r0["world"], state_group(r0)
    lay, wire, tp = tensor_parallel_of(r0, shape, cfg)
    record = strategies.get(strategy_cfg.name)
    c, cp, pp = r0.get("cp"), context_parallel_of(r0, cfg, shape.itemsize), pipeline_of(r0, cfg, shape.itemsize)
    clip = cfg.trainer.grad_clip > 0
    if pp:  # each rank its stages' calls: the formula is the mean over ranks, as the trace's bytes are
        per_rank = [pipeline_rank_calls(raw, record, pp, group, clip, shape.itemsize) for raw in raws]
        calls, formula = per_rank[0], statistics.mean(ring_bytes(x) for x in per_rank)
    else:
        calls = plan(record, lay, world, wire, group=group, grad_clip=clip, tp=tp) + (cp.calls() if cp else [])
        formula = ring_bytes(calls)
    counts: dict[str, float] = defaultdict(float)
    for r in r0["records"]:
        counts[r["op"]] += 1 / steps
    alone = _alone(raws, cost)
    note = record.note(world, group)
    if tp is not None:
        note = (f"tp {tp.size} x dp {tp.dp}, {lay.psi / shape.psi:.1%} of the parameters per rank, "
                f"{r0['tp']['batch']} sequences per tp group; "
                f"TP = {TP_CLOSED_FORM[tp.sequence_parallel, tp.vocab_parallel]}"
                f" on the critical path; memory not estimated")
    if cp:
        note = (f"cp {cp.size} x dp {world // cp.size}, {c['batch']} sequences per cp group, each rank 1/{cp.size} "
                f"of their tokens; CP = {CP_CLOSED_FORM[cp.rotate]} ({cp.rotate}) on the critical path; alone: "
                f"the collectives only (the ring's messages are not replayed); memory not estimated")
    if pp:
        b = bubble(raws) | {"formula": pp.bubble()}
        note = (f"pp {pp.size} x dp {pp.dp}, {pp.schedule}, m = {pp.microbatches} micro-batches of "
                f"{r0['pp']['batch'] // pp.microbatches} sequences; PP = {pp.term}; bubble {b['measured']:.2f} measured "
                f"(the pipeline's timeline), {b['formula']:.2f} by formula; alone: the collectives only (the "
                f"pipeline's messages are not replayed); memory not estimated")
    return {"strategy": r0["strategy"], "world": world, "backend": r0["backend"], "mesh": r0["mesh"], "note": note,
            "calls": dict(counts), "calls_formula": len(calls),
            "closed_form": closed_form(strategy_cfg.name, tp, cp, pp),
            "pp": pp and {"size": pp.size, "dp": pp.dp, "schedule": pp.schedule, "microbatches": pp.microbatches,
                          "virtual": pp.virtual, "term": pp.term, "bubble": b},
            "tp": None if tp is None else {"size": tp.size, "dp": tp.dp, "psi_per_rank": lay.psi,
                                           "term": TP_CLOSED_FORM[tp.sequence_parallel, tp.vocab_parallel]},
            "cp": cp and {"size": cp.size, "rotate": cp.rotate, "term": CP_CLOSED_FORM[cp.rotate]},
            "bytes": _bytes(raws, steps, formula), "alone": alone, "time": _time(raws, alone),
            "memory": _memory(raws, None if tp or cp or pp else prof, strategy_cfg, cfg)}
