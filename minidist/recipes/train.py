"""The training recipe: Hydra's command line in, a trained model, metrics and checkpoints out.

    torchrun --standalone --nproc_per_node=2 -m minidist.recipes.train                # the main job (ddp)
    torchrun --standalone --nproc_per_node=2 -m minidist.recipes.train strategy=full_shard model.n_layer=6
    minidist-train strategy=full_shard                                                # installed: 2 processes
    minidist-train experiment=gpt_tiny strategy=single                                # one process
    minidist-train --help | --cfg job | --info | --hydra-help                        # Hydra's own flags
    torchrun ... -m minidist.recipes.train --multirun strategy=ddp,full_shard model.n_layer=2,4

Arguments are Hydra overrides of configs/config.yaml (groups: strategy, model, data,
optim, trainer, logger, experiment) and Hydra's flags (minidist.recipes.hydra_cli). In this order:

1. Every job of the command line (one, or each job of a --multirun sweep) is composed
   and checked first, its model built on the meta device and its layout checked against
   the world: a mistake is one line (ConfigError, a runtime.UsageError: printed once, exit
   64), before any process group or file exists. minidist.recipes.torchrun runs the same
   check (check_command_line) before it starts any worker.
2. The process group is created once per process (torchrun's environment, or a world
   of one), with the backend and timeout the jobs agree on.
3. Hydra runs the jobs: the informational flags through Hydra's own `_run_hydra`, a
   sweep through hydra/sweeper=minidist and hydra/launcher=minidist (every rank runs
   the same jobs in the same order; see minidist.cli.jobs), a single run through the
   same per-job runner. Each job trains in its own directory (hydra.run.dir, or
   hydra.sweep.dir/hydra.sweep.subdir), which only the main process writes.
4. The process ends through runtime.run_main with the job's status: 0; 75 preempted after
   a checkpoint; 64 a bad input; 1 an error (one line per rank; MINIDIST_TRACEBACK=1 for
   the trace).
"""

from __future__ import annotations

import sys
from pathlib import Path

from minidist import strategies
from minidist.recipes import hydra_cli
from minidist.strategies.single import SINGLE


class Job:
    """The task function Hydra calls once per job: train over the process group made once for all jobs."""

    def __init__(self, callbacks=()):
        self.topo = None
        self.callbacks = callbacks
        self.failure: BaseException | None = None
        self.preempted = False

    def __call__(self, cfg) -> dict:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf

        from minidist.recipes.launch import continue_command
        from minidist.train.run_dir import RunRequest
        from minidist.train.trainer import train

        try:
            hc = HydraConfig.get()
            chose_dir = [o for o in hc.overrides.hydra if o.split("=", 1)[0] == "hydra.run.dir"]
            sweep = hc.mode == RunMode.MULTIRUN
            run_dir = Path(hc.runtime.output_dir)
            # a sweep's job is continued by its sweep's command: none to print for one job
            command = None if sweep else continue_command([*hc.overrides.task, *chose_dir], run_dir)
            request = RunRequest(dir=run_dir, named=sweep or bool(chose_dir), overrides=tuple(hc.overrides.task),
                                 hydra_yaml=OmegaConf.to_yaml({"hydra": hc}), command=command)
            result = train(cfg, self.topo, self.callbacks, request)
            result.pop("model_state", None)  # the sweep keeps every job's result: not its weights
            self.preempted = bool(result.get("preempted"))  # the launcher starts no further job
            return result
        except Exception as exc:
            self.failure = exc
            raise


def main(argv: list[str] | None = None, callbacks=()) -> None:
    """The command line (console script minidist-train); callbacks go to train() (tests inject faults so).
    Ends the process with the job's status (runtime.run_main): 0, 64 for a bad input (one line, from
    local rank 0), 75 when preempted after a checkpoint, 1 for any other error (one line per rank)."""
    from minidist import runtime

    runtime.run_main(lambda: _main(sys.argv[1:] if argv is None else list(argv), callbacks))


def console(argv: list[str] | None = None) -> None:
    """The console script minidist-train: the README's world (minidist.recipes.launch: 2 processes, or every
    GPU, under minidist.recipes.torchrun), one process for strategy=single and Hydra's informational flags."""
    from minidist.recipes import launch

    launch.console("minidist-train", "minidist.recipes.train", sys.argv[1:] if argv is None else list(argv), main,
                   _one_process)


def _one_process(argv: list[str]) -> bool:
    args, _ = hydra_cli.parse(argv)
    if hydra_cli.is_informational(args):
        return True
    return all(strategies.get(cfg.strategy.name) is SINGLE for cfg in _check_jobs(args, (None, None)))


def check_command_line(argv: list[str], world_size: int | None, local_world_size: int | None) -> None:
    """Compose and check every job of `argv` at this world (minidist.recipes.torchrun calls it before
    starting the workers); raises ConfigError. Hydra's informational flags are not checked here."""
    args, _ = hydra_cli.parse(argv)
    if not hydra_cli.is_informational(args):
        _check_jobs(args, (world_size, local_world_size))


def _main(argv: list[str], callbacks) -> int:
    from minidist import runtime
    from minidist.train.preemption import EXIT_PREEMPTED

    args, parser = hydra_cli.parse(argv)
    informational = hydra_cli.is_informational(args)
    # ConfigError: one line, before any process group or file exists; --cfg shows a config for any world
    cfgs = _check_jobs(args, (None, None) if informational else None)
    if informational:
        hydra_cli.informational(args, parser, "config")
        return 0
    backend, timeout_s = cfgs[0].backend.value, float(cfgs[0].timeout_s)
    job = Job(callbacks)
    with runtime.distributed(backend, timeout_s) as topo:
        from minidist.train.run_dir import share_stamp

        job.topo = topo
        share_stamp(topo)  # new run names carry rank 0's clock on every rank
        if args.multirun:
            hydra_cli.run_hydra(args, parser, job, "config")
        else:
            _run_single(args, job)
        if job.failure is not None:
            raise job.failure
    # checkpointed; torchrun's restart or a SLURM requeue resumes it (resume=auto)
    return EXIT_PREEMPTED if job.preempted else 0


def _check_jobs(args, world: tuple[int | None, int | None] | None = None) -> list:
    """Compose every job of the command line with minidist's checks (ConfigError: one line): each job's
    config, its model (built on the meta device), its layout at `world` (compose.compose_config), and
    that the jobs agree on what the one process group needs."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from minidist.cli.compose import ConfigError, compose_config, register_schemas

    register_schemas()
    if args.config_path is not None:
        raise ConfigError("--config-path replaces minidist's configs; add a directory of your own configs "
                          "with --config-dir instead")
    if args.experimental_rerun is not None:
        raise ConfigError("--experimental-rerun is not supported; rerun with the same overrides "
                          "(<run>/.hydra/overrides.yaml) and resume=auto")
    parser, parsed = OverridesParser.create(), []
    for line in args.overrides:
        try:
            parsed.append(parser.parse_override(line))
        except Exception as exc:  # noqa: BLE001 - Hydra's grammar errors: one line naming the override
            raise ConfigError(f"cannot parse {line!r}: {' '.join(str(exc).split())}") from exc
    sweeping = any(o.is_sweep_override() for o in parsed)
    if sweeping and not args.multirun:
        if args.cfg or args.help or args.info:
            return []  # Hydra itself explains that a sweep needs --multirun
        raise ConfigError(f"{' '.join(o.input_line for o in parsed if o.is_sweep_override())} is a sweep: "
                          f"add --multirun (-m) to run one job per value")
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch] if sweeping \
        else [list(args.overrides)]
    cfgs = [compose_config(job, args.config_name or "config", args.config_dir, world) for job in jobs]
    if len({(cfg.backend.value, float(cfg.timeout_s)) for cfg in cfgs}) > 1:
        raise ConfigError("every job of a sweep needs the same backend and timeout_s: the process "
                          "group is created once, for all of them")
    return cfgs


def _run_single(args, job: Job) -> None:
    """One job in hydra.run.dir, through minidist.cli.jobs.run_job (Hydra's Hydra.run, minus its writes)."""
    import os

    from hydra._internal.callbacks import Callbacks
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import open_dict

    from minidist.cli.config import CONFIG_DIR
    from minidist.cli.jobs import run_job

    search_path = create_automatic_config_search_path(None, None, str(CONFIG_DIR))
    if args.config_dir is not None:
        search_path.prepend(provider="command-line", path=f"file://{os.path.abspath(args.config_dir)}",
                            anchor=SearchPathQuery(provider="schema"))
    hydra = Hydra.create_main_hydra2(task_name="train", config_search_path=search_path)
    name = args.config_name or "config"
    try:
        cfg = hydra.compose_config(config_name=name, overrides=list(args.overrides), run_mode=RunMode.RUN,
                                   with_log_configuration=False)
        with open_dict(cfg):
            cfg.hydra.mode = RunMode.RUN
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=name)
        ret = run_job(cfg, job, "hydra.run.dir", None, callbacks)
        callbacks.on_run_end(config=cfg, config_name=name, job_return=ret)
    finally:
        GlobalHydra.instance().clear()


if __name__ == "__main__":
    main()
