"""The comparison end to end: measure every strategy on every rank, then report on the main process.

    result = compare(cfg, topo)      # every rank; the main process returns the rows, others None
    text = estimate_table(cfg)       # no process group: predicted peak memory only

Files in the run directory (<out_dir>/<name>, default compare-<timestamp>): table.md, table.csv,
results.json (rows, calibration, projection), comparison.png, timeline.json (Chrome trace) and
timeline.png, projection.csv and projection.png.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from minidist import Topology, comm
from minidist.compare import plots, projection, timeline
from minidist.compare.analysis import strategy_row
from minidist.compare.analytic import Layout, plan, ring_bytes
from minidist.compare.estimate import OPTIMIZER_STATE_TENSORS, estimate_memory, model_state_bytes
from minidist.compare.measure import measure_strategy
from minidist.compare.profile import StepProfile, profile_step
from minidist.compare.recorder import StepRecorder
from minidist.compare.report import table_text, write_tables
from minidist.mesh import data_parallel_mesh, is_main
from minidist.train.data import build_datasets
from minidist.train.run_dir import run_dir_for
from minidist.train.task import make_task

MIB = 2 ** 20


def _gather(obj, topo: Topology) -> list | None:
    """Every rank's `obj` on rank 0, in rank order (pickled; outside any measured window)."""
    out = [None] * topo.world_size if topo.rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def compare(cfg, topo: Topology) -> dict | None:
    """Run every strategy of cfg.strategies on this rank; the main process writes and prints the results."""
    mesh = data_parallel_mesh(topo)
    run_dir = run_dir_for(cfg, topo, mesh, prefix="compare")
    train_ds, _, _ = build_datasets(cfg, topo)
    cost = comm.calibrate()
    dist.barrier()
    rec = StepRecorder(time.perf_counter())
    per_strategy = []
    for name in cfg.strategies:
        per_strategy.append(_gather(measure_strategy(cfg, cfg.strategy_options[name], topo, train_ds, rec), topo))
    if not is_main(mesh):
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    return report(cfg, run_dir, per_strategy, cost)


def _meta_model(cfg):
    task = make_task(cfg.model)
    with torch.device("meta"):
        model, blocks = task.build()
    return task, model, blocks


def meta_batch(cfg) -> list[torch.Tensor]:
    """One rank's batch as meta tensors: shapes and dtypes of what BatchStream yields."""
    b = cfg.trainer.batch_size
    if cfg.model.name == "gpt":
        x = torch.empty(b, cfg.model.block_size, dtype=torch.long, device="meta")
        return [x, x]
    return [torch.empty(b, 3, 32, 32, device="meta"), torch.empty(b, dtype=torch.long, device="meta")]


def _profile(cfg, device: str = "cpu", dtype: torch.dtype | None = None) -> tuple[StepProfile, Layout]:
    """The plain model's step on fake tensors (for the memory estimate), and its communication layout."""
    task, model, blocks = _meta_model(cfg)
    if dtype is not None:
        model = model.to(dtype)
    prof = profile_step(model, meta_batch(cfg), task.loss, blocks, device)
    return prof, Layout.from_model(model, blocks)


def report(cfg, run_dir: Path, per_strategy: list[list[dict]], cost: comm.CostModel) -> dict:
    """Rows, table, chart, timeline and projection from every rank's raw results (main process)."""
    r0 = per_strategy[0][0]
    prof, layout = _profile(cfg, r0["device"])
    rows = [strategy_row(raws, layout, cost, prof if cfg.memory else None, cfg, cfg.strategy_options[raws[0]["strategy"]])
            for raws in per_strategy]
    ddp = next((r for r in rows if r["strategy"] == "ddp"), None)
    ddp_bytes = ddp["ring_bytes"] if ddp else ring_bytes(plan("ddp", layout, r0["world"]))
    header = (f"# minidist strategy comparison\n\n{cfg.model.name} ({layout.psi / 1e6:.2f}M parameters), world "
              f"{r0['world']}, {r0['backend']}, batch {cfg.trainer.batch_size} per rank, {cfg.steps} measured steps "
              f"after {cfg.warmup_steps} warm-up; calibrated alpha {cost.alpha * 1e6:.1f} us, beta "
              f"{cost.beta * 1e9:.3f} ns/B ({1 / cost.beta / 1e9 if cost.beta else float('inf'):.2f} GB/s)")
    text = table_text(rows, ddp_bytes)
    raws = [raw for raws in per_strategy for raw in raws]
    (run_dir / "timeline.json").write_text(json.dumps(timeline.chrome_trace(raws)))
    proj_rows, verdicts = _projection(cfg, rows, layout, cost, run_dir)
    files = write_tables(run_dir, rows, ddp_bytes, header, {
        "calibration": {"alpha_s": cost.alpha, "beta_s_per_byte": cost.beta}, "projection": proj_rows,
        "psi": layout.psi})
    files += [plots.draw_comparison(rows, run_dir / "comparison.png", header.splitlines()[-1]),
              run_dir / "timeline.json", timeline.draw_png(raws, run_dir / "timeline.png"),
              run_dir / "projection.csv", projection.draw_png(proj_rows, run_dir / "projection.png")]
    print(header.replace("# ", "") + "\n\n" + text + "\n\nprojection (ring; comm per step vs compute per step):\n"
          + "\n".join(verdicts) + "\n\noutputs in " + str(run_dir) + ": " + ", ".join(f.name for f in files), flush=True)
    return {"rows": rows, "run_dir": str(run_dir), "projection": proj_rows}


def _projection(cfg, rows: list[dict], layout: Layout, cost: comm.CostModel, run_dir: Path):
    p = cfg.projection
    ddp = next((r for r in rows if r["strategy"] == "ddp"), rows[0])
    measured = projection.Subject(f"{layout.psi / 1e6:.1f}M", layout, ddp["time"]["compute_s"])
    user = projection.Subject(f"{p.params / 1e9:g}B", Layout.uniform(p.params, p.layers, int(p.bucket_cap_mb * MIB),
                                                                     p.bytes_per_param),
                              6 * p.params * p.tokens_per_rank / p.flops_per_s)
    profiles = [projection.Profile("calibrated", cost.alpha, 1 / cost.beta if cost.beta else 0.0)]
    profiles += [projection.Profile(name, v.alpha_us * 1e-6, v.bandwidth_GBps * 1e9) for name, v in p.profiles.items()]
    intra = next(x for x in profiles if x.name == p.intra_node)
    rows_p = projection.project([measured, user], profiles, list(cfg.strategies), list(p.ranks), p.ranks_per_node, intra)
    with open(run_dir / "projection.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_p[0]))
        w.writeheader()
        w.writerows(rows_p)
    return rows_p, projection.verdicts(rows_p)


def estimate_table(cfg) -> str:
    """Predicted per-rank peak for every strategy and world size of cfg.estimate (nothing runs)."""
    e = cfg.estimate
    dtype = e.dtype.torch_dtype
    prof, layout = _profile(cfg, e.device, dtype)
    k = OPTIMIZER_STATE_TENSORS[cfg.optim.name] * prof.itemsize
    lines = [f"predicted per-rank peak memory, MiB: {cfg.model.name} ({layout.psi / 1e6:.2f}M parameters, "
             f"{str(dtype).removeprefix('torch.')}), batch {cfg.trainer.batch_size} per rank, {cfg.optim.name} "
             f"(K = {k} bytes/param); in brackets ZeRO's model states alone, (p + g + K) psi family",
             f"{'strategy':<14}" + "".join(f"{'N=' + str(n):>20}" for n in e.worlds)]
    for name in cfg.strategies:
        so = cfg.strategy_options[name]
        cells = []
        for n in e.worlds:
            est = estimate_memory(prof, name, n, optimizer=cfg.optim.name, backend="nccl" if e.device == "cuda" else "gloo",
                                  shard_size=getattr(so, "shard_size", None) and min(so.shard_size, n))
            states = model_state_bytes(layout.psi, name, n, prof.itemsize, prof.itemsize, k)["total"]
            cells.append(f"{est.total / MIB:9.2f} [{states / MIB:8.2f}]")
        lines.append(f"{name:<14}" + "".join(f"{c:>20}" for c in cells))
    return "\n".join(lines)
