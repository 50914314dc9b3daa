"""Hydra jobs on every rank of one process group: run one, launch a sweep's, summarise them.

Under torchrun every rank runs the same command line, so Hydra composes the same job
list in the same order on every rank (the basic sweep is a deterministic cartesian
product), and the jobs run one after another over the one process group the recipe
created. Hydra's own `run_job` would, on every rank and before the task starts, create
the job's directory, write .hydra/ into it (over an existing run's files, before anything
is validated), configure logging and maybe change the working directory. `run_job` here
does what a task needs from Hydra and nothing else: the job's output directory in
HydraConfig, `hydra.job.env_set`, Hydra's callbacks. The task (minidist.recipes.train)
decides the run directory and writes .hydra/ from the main process once the run is
validated (minidist.train.run_dir).

A sweep stops at its first failed job (after an error inside a collective the process
group cannot be trusted) and after a preempted one (the recipe then exits 75 for a requeue;
re-running the sweep with the same hydra.sweep.dir and resume=auto skips the finished jobs). The main process writes <sweep dir>/multirun.yaml before the
first job and prints a summary (also <sweep dir>/summary.jsonl) after the last.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus, env_override, filter_overrides, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict, read_write


def is_main() -> bool:
    """Global rank 0 (the process group exists by the time any job runs), or a process outside torchrun."""
    return dist.get_rank() == 0 if dist.is_initialized() else os.environ.get("RANK", "0") == "0"


def say(text: str) -> None:
    if is_main():
        print(text, flush=True)


def run_job(config: DictConfig, task: Callable[[DictConfig], Any], dir_key: str, subdir_key: str | None,
            callbacks) -> JobReturn:
    """Hydra's run_job without its side effects (see the module docstring); a failure is in the JobReturn."""
    output_dir = str(OmegaConf.select(config, dir_key))
    if subdir_key is not None:
        output_dir = os.path.join(output_dir, str(OmegaConf.select(config, subdir_key)))
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = os.path.abspath(output_dir)
    previous = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(config)
    ret = JobReturn(overrides=list(config.hydra.overrides.task), working_dir=os.getcwd())
    ret.task_name = config.hydra.job.name
    ret.hydra_cfg = copy.deepcopy(HydraConfig.instance().cfg)
    ret.cfg = copy.deepcopy(config)
    with read_write(ret.cfg), open_dict(ret.cfg):
        del ret.cfg["hydra"]
    try:
        with env_override(ret.hydra_cfg.hydra.job.env_set):
            callbacks.on_job_start(config=config, task_function=task)
            try:
                if config.hydra.job.chdir:
                    raise ValueError("hydra.job.chdir=true is not supported: minidist never changes the working "
                                     "directory (relative out_dir and data.root stay relative to the launch)")
                ret.return_value, ret.status = task(ret.cfg), JobStatus.COMPLETED
            except Exception as exc:  # noqa: BLE001 - reported by the caller, one line per rank
                ret.return_value, ret.status = exc, JobStatus.FAILED
            callbacks.on_job_end(config=config, job_return=ret)
    finally:
        HydraConfig.instance().cfg = previous
    return ret


def launch(hydra_context, config: DictConfig, task, job_overrides: Sequence[Sequence[str]],
           initial_job_idx: int) -> list[JobReturn]:
    """The launcher: each job's config (Hydra's load_sweep_config), run in order; stop after a failure."""
    setup_globals()
    say(f"[HYDRA] Launching {len(job_overrides)} jobs in this process group (hydra/launcher=minidist)")
    runs = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        say(f"[HYDRA] \t#{idx} : {' '.join(filter_overrides(overrides))}")
        job_cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(job_cfg):
            job_cfg.hydra.job.id = job_cfg.hydra.job.num = idx
        t0 = time.perf_counter()
        ret = run_job(job_cfg, task, "hydra.sweep.dir", "hydra.sweep.subdir", hydra_context.callbacks)
        ret.wall_s = time.perf_counter() - t0
        runs.append(ret)
        if ended_sweep(ret):
            break
    return runs


def ended_sweep(ret: JobReturn) -> bool:
    """A failed job, or one stopped by preemption (the process is about to be ended): no further job starts."""
    value = ret._return_value
    return ret.status is JobStatus.FAILED or (isinstance(value, dict) and bool(value.get("preempted")))


def sweep(sweeper, arguments: list[str]) -> list[Sequence[JobReturn]]:
    """The sweeper: Hydra's basic expansion and batching; multirun.yaml, stop at a failure, summary."""
    params = sweeper._parse_config() + list(arguments)
    parsed = OverridesParser.create(config_loader=sweeper.hydra_context.config_loader).parse_overrides(params)
    sweeper.overrides = sweeper.split_arguments(parsed, sweeper.max_batch_size)
    sweep_dir = Path(str(sweeper.config.hydra.sweep.dir))
    if is_main():
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(sweeper.config, sweep_dir / "multirun.yaml")
    returns: list[Sequence[JobReturn]] = []
    start = 0
    while not sweeper.is_done():
        batch = sweeper.get_job_batch()
        results = sweeper.launcher.launch(batch, initial_job_idx=start)
        returns.append(results)
        start += len(batch)
        if any(ended_sweep(r) for r in results):
            break
    if is_main():
        rows = summary_rows([r for batch in returns for r in batch])
        total = sum(len(b) for b in sweeper.overrides)
        print(format_summary(rows, sweep_dir, total), flush=True)
        with open(sweep_dir / "summary.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return returns


def swept(runs: Sequence[JobReturn]) -> list[list[str]]:
    """Each job's overrides of the keys that differ between the jobs (all of them for a lone job)."""
    lists = [list(filter_overrides(r.overrides)) for r in runs]
    values: dict[str, set] = {}
    for job in lists:
        for o in job:
            values.setdefault(o.split("=", 1)[0], set()).add(o)
    varying = {k for k, v in values.items() if len(v) > 1 or sum(k == o.split("=", 1)[0] for j in lists
                                                                    for o in j) < len(lists)}
    return [[o for o in job if o.split("=", 1)[0] in varying] or job for job in lists] if len(lists) > 1 else lists


def summary_rows(runs: Sequence[JobReturn]) -> list[dict]:
    rows = []
    for ret, shown in zip(runs, swept(runs)):
        row = {"job": int(ret.hydra_cfg.hydra.job.num), "overrides": " ".join(shown),
               "wall_s": round(getattr(ret, "wall_s", 0.0), 1)}
        value = ret._return_value
        if ret.status is JobStatus.FAILED:
            row |= {"status": "failed", "error": f"{type(value).__name__}: {str(value).splitlines()[0] if str(value) else ''}"}
        else:
            value = value if isinstance(value, dict) else {}
            status = "already finished" if value.get("finished_already") else "preempted" \
                if value.get("preempted") else "stopped" if value.get("stopped") else "done"
            row |= {"status": status, "run_dir": value.get("run_dir")}
            row |= {k: v for k, v in value.items() if k.startswith("val/")}
        rows.append(row)
    return rows


def format_summary(rows: list[dict], sweep_dir: Path, total: int) -> str:
    """A table, one line per job: number, overrides, status, final validation metrics, wall time."""
    width = max([len(r["overrides"]) for r in rows] + [9])
    lines = [f"sweep {sweep_dir.resolve()}: {len(rows)} of {total} jobs ran, "
             f"{sum(r['status'] != 'failed' for r in rows)} succeeded"]
    lines.append(f"  {'job':>3}  {'overrides'.ljust(width)}  {'status':16}  {'wall_s':>7}  result")
    for r in rows:
        result = r.get("error") or "  ".join(f"{k} {v:.4f}" for k, v in r.items() if k.startswith("val/"))
        lines.append(f"  {r['job']:>3}  {r['overrides'].ljust(width)}  {r['status']:16}  {r['wall_s']:>7.1f}  {result}")
    lines.append(f"runs in {sweep_dir.resolve()}/<job>; this table in summary.jsonl")
    return "\n".join(lines)
