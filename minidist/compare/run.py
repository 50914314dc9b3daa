"""The comparison end to end: measure every strategy on every rank, then report on the main process.

    result = compare(cfg, topo)      # every rank; the main process returns the rows, others None
    text = estimate_table(cfg)       # no process group: predicted memory only

Files in the run directory (<out_dir>/<name>, default compare-<timestamp>): table.md, table.csv,
results.json (rows, calibration, projection), comparison.png, timeline.json (Chrome trace) and
timeline.png, projection.csv and projection.png; after an interrupt, the strategies measured so
far, and INTERRUPTED naming those left.
"""

from __future__ import annotations

import csv
import json
import textwrap
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from minidist import Topology, comm, strategies
from minidist.compare import at_scale, plots, projection, report as rep, timeline
from minidist.compare.analysis import context_parallel_of, pipeline_of, stage_shape, strategy_row, tensor_parallel_of
from minidist.compare.analytic import plan, ring_bytes
from minidist.compare.config import REFERENCE
from minidist.compare.rows import Row, check_rows_world, row_strategy
from minidist.compare.estimate import estimate_memory
from minidist.compare.measure import measure_strategy
from minidist.compare.plan import GPTModel, Hardware, Layout, memory as plan_memory
from minidist.compare.profile import StepProfile, model_shape, profile_step
from minidist.compare.progress import Progress
from minidist.mesh import data_parallel_mesh, is_main
from minidist.precision import RunPrecision
from minidist.shape import ModelShape
from minidist.strategies import Wire
from minidist.train.data import build_datasets
from minidist.train.preemption import PreemptionWatch
from minidist.train.run_dir import run_dir_for
from minidist.train.task import make_task

MIB = 2 ** 20


def _gather(obj, topo: Topology) -> list | None:
    """Every rank's `obj` on rank 0, in rank order (pickled; outside any measured window)."""
    out = [None] * topo.world_size if topo.rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


class _Stop(Exception):
    """Every rank voted, at a phase boundary, that a signal arrived: measure no further."""


STOPPING = ("SIGINT: stopping after this phase; the strategies measured so far will be saved (Ctrl-C again stops "
            "at once)")


def compare(cfg, topo: Topology) -> dict | None:
    """Run every strategy of cfg.strategies on this rank; the main process writes and prints the results
    (None elsewhere). Progress: a bar on the main process (minidist.compare.progress). A SIGINT (Ctrl-C) or
    SIGTERM stops every rank at the next phase boundary (a one-element vote there, outside any measured
    window); the main process then reports the strategies measured so far, and the result says
    "interrupted" (the signal's name)."""
    check_rows_world(cfg, topo.world_size)
    mesh = data_parallel_mesh(topo)
    run_dir = run_dir_for(cfg, topo, mesh, prefix="compare")
    main = is_main(mesh)
    watch = PreemptionWatch(["SIGINT", "SIGTERM"], topo.device, announce=STOPPING if main else None)
    progress, per_strategy, interrupted = Progress(cfg.strategies, main), [], None
    try:
        train_ds, _, _ = build_datasets(cfg, topo)
        cost = comm.calibrate()
        dist.barrier()
        t0 = time.perf_counter()
        for name in cfg.strategies:
            def phase(what: str, name: str = name) -> None:
                progress.phase(name, what)
                if watch.vote():
                    raise _Stop
            per_strategy.append(_gather(measure_strategy(cfg, row_strategy(cfg, name), topo, train_ds, t0, name,
                                                         phase), topo))
            progress.done(name)
    except _Stop:
        interrupted = watch.caught or "a signal on another rank"
    finally:
        watch.close()
        progress.close()
    if not main:
        return {"interrupted": interrupted} if interrupted else None
    if interrupted and not per_strategy:
        print(f"interrupted ({interrupted}) before the first strategy was measured: nothing saved", flush=True)
        return {"interrupted": interrupted, "rows": [], "run_dir": None}
    run_dir.mkdir(parents=True, exist_ok=True)
    done = [raws[0]["strategy"] for raws in per_strategy]
    result = report(OmegaConf.merge(cfg, {"strategies": done}) if interrupted else cfg, run_dir, per_strategy, cost)
    if interrupted:
        left = [s for s in cfg.strategies if s not in done]
        line = (f"interrupted ({interrupted}) after {len(done)} of {len(cfg.strategies)} strategies: their rows are "
                f"in {run_dir}; not measured: {', '.join(left)}")
        (run_dir / "INTERRUPTED").write_text(line + "\n")  # the tables alone would not say they are partial
        print(line, flush=True)
    return result | {"interrupted": interrupted}


def meta_batch(cfg) -> list[torch.Tensor]:
    """One rank's batch as meta tensors: shapes and dtypes of what BatchStream yields."""
    b = cfg.trainer.batch_size
    if cfg.model.name == "gpt":
        x = torch.empty(b, cfg.model.block_size, dtype=torch.long, device="meta")
        return [x, x]
    return [torch.empty(b, 3, 32, 32, device="meta"), torch.empty(b, dtype=torch.long, device="meta")]


def _profile(cfg, device: str = "cpu", dtype: torch.dtype | None = None) -> tuple[StepProfile, ModelShape]:
    """The plain model's step on fake tensors (for the memory estimate), and its shape."""
    task = make_task(cfg.model)
    with torch.device("meta"):
        model, blocks = task.build()
    if dtype is not None:
        model = model.to(dtype)
    prof = profile_step(model, meta_batch(cfg), task.loss, blocks, device)
    return prof, model_shape(model, blocks)


def report(cfg, run_dir: Path, per_strategy: list[list[dict]], cost: comm.CostModel) -> dict:
    """Rows, tables, charts, timeline and projection from every rank's raw results (main process)."""
    r0 = per_strategy[0][0]
    prof, shape = _profile(cfg, r0["device"])
    rows = [strategy_row(raws, shape, cost, prof if cfg.memory else None, cfg, row_strategy(cfg, raws[0]["strategy"]))
            for raws in per_strategy]
    ddp = next((r for r in rows if r["strategy"] == REFERENCE), None)  # the bytes every row is a multiple of
    ddp_bytes = ddp["bytes"]["trace"] if ddp else ring_bytes(plan(REFERENCE, shape, r0["world"]))
    instrument = next((r["memory"]["instrument"] for r in rows if r["memory"]), "-")
    link = (f"calibrated alpha {cost.alpha * 1e6:.1f} us, beta {cost.beta * 1e9:.3f} ns/B ({1 / cost.beta / 1e9:.2f} "
            f"GB/s)" if r0["world"] > 1 and cost.beta > 0 else "no link at world 1: alpha and beta not calibrated, "
            "nothing sent (run under torchrun --nproc_per_node=2 or more to compare communication)")
    header = (f"# minidist strategy comparison\n\n{cfg.model.name} ({shape.psi / 1e6:.2f}M parameters), world "
              f"{r0['world']}, {r0['backend']} on {r0['device']}, batch {cfg.trainer.batch_size} per rank, {cfg.steps} "
              f"measured steps after {cfg.warmup_steps} warm-up; {link}; memory peak: {instrument}.")
    raws = [raw for raws in per_strategy for raw in raws]
    (run_dir / "timeline.json").write_text(json.dumps(timeline.chrome_trace(raws)))
    proj_rows, clusters = _projection(cfg, rows, per_strategy, shape, cost)
    devices = list(cfg.projection.devices_GB)
    with open(run_dir / "projection.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(proj_rows[0]))
        w.writeheader()
        w.writerows(proj_rows)
    files = rep.write_tables(run_dir, rows, ddp_bytes, header, {
        "calibration": {"alpha_s": cost.alpha, "beta_s_per_byte": cost.beta}, "projection": proj_rows,
        "psi": shape.psi})
    files += [plots.draw_comparison(rows, run_dir / "comparison.png", header.splitlines()[-1]),
              run_dir / "timeline.json", timeline.draw_png(raws, run_dir / "timeline.png"),
              run_dir / "projection.csv", plots.draw_projection(proj_rows, clusters, run_dir / "projection.png",
                                                                       devices)]
    wrap = lambda text: "\n".join(textwrap.wrap(text, 120))  # noqa: E731
    print("\n\n".join([wrap(header.splitlines()[0].lstrip("# ")), wrap(header.splitlines()[-1]),
                       rep.terminal(rows, ddp_bytes),
                       wrap(f"projection ({cfg.projection.precision}): per call NCCL's choice (tuning.cc); exposed "
                            ">= what compute cannot hide (forward calls behind forward, backward calls behind "
                            "backward, ZeRO's parameter exchange and "
                            "TP's calls behind nothing: the next layer waits for TP's):")
                       + "\n" + "\n".join(projection.verdicts(proj_rows, devices)),
                       wrap(f"outputs in {run_dir}: " + ", ".join(f.name for f in files))]), flush=True)
    return {"rows": rows, "run_dir": str(run_dir), "projection": proj_rows}


def _projection(cfg, rows: list[dict], per_strategy, shape: ModelShape, cost: comm.CostModel):
    """This machine's model on its calibrated link, and cfg.projection.params on every configured cluster.

    A tensor-parallel row keeps its tp group on consecutive ranks (inside a node while T <= GPUs per
    node) and its data parallelism across the nodes; each tp group shares T ranks' tokens, so compute
    per rank is the other rows' (the measured model: its sliced shape and TP's calls as measured)."""
    p, names = cfg.projection, list(cfg.strategies)
    phases = rows[0]["time"]["baseline_phases"]
    r0 = per_strategy[0][0]
    reference = next((raws[0]["bucket_numels"] for raws in per_strategy if raws[0]["strategy"] == REFERENCE), ())
    measured = {raws[0]["strategy"]: tensor_parallel_of(raws[0], shape, cfg) for raws in per_strategy}
    stages = {raws[0]["strategy"]: stage_shape(raws[0], shape.itemsize) for raws in per_strategy if raws[0]["pp"]}
    options = {s: row_strategy(cfg, s) for s in names}
    here = projection.Subject(
        f"{shape.psi / 1e6:.1f}M (this machine)", {s: stages[s][0] if s in stages else measured[s][0] for s in names},
        phases.get("forward", 0.0), phases.get("backward", 0.0), None, ("calibrated",), r0["local_world"],
        {s: stages[s][1] if s in stages else measured[s][1] if measured[s][2] else Wire(tuple(reference))
         for s in names}, options, {s: tp for s, (_, _, tp) in measured.items() if tp is not None},
        cp={raws[0]["strategy"]: context_parallel_of(raws[0], cfg, shape.itemsize)
            for raws in per_strategy if raws[0].get("cp")},
        pp={raws[0]["strategy"]: pipeline_of(raws[0], cfg, shape.itemsize) for raws in per_strategy if raws[0]["pp"]})
    link = ([projection.calibrated(cost.alpha, cost.beta, cost.alpha_err, cost.beta_err, cost.cov, cost.residual)]
            if r0["world"] > 1 else [])  # none at world 1
    clusters = link + at_scale.gpu_clusters(p)
    return projection.project([here, at_scale.subject(p, names, options, cfg.pp_microbatches)], clusters, names,
                              list(p.ranks),
                              list(p.devices_GB)), clusters


def estimate_table(cfg) -> str:
    """Predicted per-rank memory for every strategy and world size of cfg.estimate (nothing runs)."""
    e = cfg.estimate
    if e.params:
        return _paper_table(cfg)
    dtype = e.dtype.torch_dtype
    prof, shape = _profile(cfg, e.device, dtype)
    k = 2 * prof.itemsize if cfg.optim.name == "adamw" else prof.itemsize
    lines = [f"predicted per-rank peak memory, MiB: {cfg.model.name} ({shape.psi / 1e6:.2f}M parameters, "
             f"{str(dtype).removeprefix('torch.')}), batch {cfg.trainer.batch_size} per rank, {cfg.optim.name} "
             f"(K = {k} bytes/param); in brackets ZeRO's model states alone, (p + g + K) psi family",
             f"{'strategy':<14}" + "".join(f"{'N=' + str(n):>20}" for n in e.worlds)]
    for name in cfg.strategies:
        if Row.parse(name).dim:  # by the planner's formula (the profile knows no tp, cp or pp)
            lines.append(f"{name:<14}" + "".join(f"{c:>20}" for c in _formula_cells(cfg, name, dtype)))
            continue
        so, record = cfg.strategy_options[name], strategies.get(name)
        cells = []
        for n in e.worlds:
            group = record.state_group(so, n, e.gpus_per_node)
            est = estimate_memory(prof, so, n, device=e.device, optimizer=cfg.optim.name, group=group,
                                  backend="nccl" if e.device == "cuda" else "gloo")
            states = record.model_state_bytes(shape.psi, group, prof.itemsize, prof.itemsize, k)["total"]
            cells.append(f"{est.total / MIB:9.2f} [{states / MIB:8.2f}]")
        lines.append(f"{name:<14}" + "".join(f"{c:>20}" for c in cells))
    return "\n".join(lines)


def _formula_cells(cfg, row: str, dtype: torch.dtype) -> list[str]:
    """A tp, cp or pp row's peak per rank by the planner's formula (minidist.compare.plan.memory: the record's states
    over a rank's slices of its stage, its engine's buffers, the activations of the T x C x P x batch sequences its
    group shares, a pipeline's in m = pp_microbatches micro-batches of which 1F1B holds P in flight; within 5% of
    the allocator for tp at 4 processes: tests/compare/test_plan.py), MiB; "-" where the degree does not divide
    the world. The formula knows minidist's GPT trained in fp32 with AdamW only."""
    r = Row.parse(row)
    if cfg.model.name != "gpt" or dtype != torch.float32 or cfg.optim.name != "adamw":
        return ["not estimated"] * len(cfg.estimate.worlds)
    e, so, model = cfg.estimate, cfg.strategy_options[r.base], GPTModel.of_config(cfg.model)
    batch = cfg.trainer.batch_size * r.size // (cfg.pp_microbatches if r.pp > 1 else 1)
    lays = {n: Layout(n // r.size, r.tp, r.pp, r.cp, strategy=r.base, micro_batch=batch,
                      sequence_parallel=bool(so.sequence_parallel)) for n in e.worlds if n % r.size == 0}
    hw = Hardware(gpus_per_node=e.gpus_per_node)
    peak = {n: plan_memory(model, lay, cfg.model.block_size, "fp32", hw, device=e.device)["total"]
            for n, lay in lays.items()}
    return [f"{peak[n] / MIB:9.2f} (formula)" if n in peak else "-" for n in e.worlds]


def _paper_table(cfg) -> str:
    """ZeRO's model states per rank in GB for a bare parameter count (Rajbhandari et al. 2020, Figure 1)."""
    e = cfg.estimate
    run = RunPrecision("fp16" if e.precision == "mixed" else e.precision)  # mixed: the paper's fp16 training
    p = g = run.compute_bytes
    k = run.optimizer_bytes
    lines = [f"model states per rank, GB (1e9 bytes): {e.params / 1e9:g}B parameters, {run.name}"
             f"{' with fp32 masters' if run.name != 'fp32' else ''} (p = {p}, g = {g}, K = {k} bytes per "
             f"parameter); ZeRO's formulas, no activations (--plan adds them)",
             f"{'strategy':<14}{'formula':>26}" + "".join(f"{'N=' + str(n):>10}" for n in e.worlds)]
    for row in cfg.strategies:  # a tp (pp) row: a rank's slices (stage), psi / T (/ P), over the N / T (/ P) others
        r, so = Row.parse(row), row_strategy(cfg, row)
        record, split = strategies.get(r.base), r.tp * r.pp
        groups = [record.state_group(so, n, e.gpus_per_node) if n % r.size == 0 else 0 for n in e.worlds]  # / T, / P
        cells = [f"{record.model_state_bytes(e.params / split, group, p, g, k)['total'] / 1e9:.1f}" if group else "-"
                 for group in groups]
        formula = record.states_formula
        formula = formula if split == 1 else formula.replace("psi", f"psi/{r.dim.upper()[0]}").replace("/N", "/D")
        lines.append(f"{row:<14}{formula:>26}" + "".join(f"{c:>10}" for c in cells))
    if any(Row.parse(row).tp > 1 for row in cfg.strategies):
        lines.append("<strategy>+tp<T>: a rank's slices, psi/T (the embeddings' share ignored), over D = N / T ranks")
    if any(Row.parse(row).pp > 1 for row in cfg.strategies):
        lines.append("<strategy>+pp<P>: a rank's stage, psi/P (the embeddings' share ignored), over D = N / P ranks")
    return "\n".join(lines)
