"""Compare strategies side by side: the same model and data under each, measured next to the formulas.

    torchrun --standalone --nproc_per_node=2 -m recipes.compare
    torchrun --standalone --nproc_per_node=2 -m recipes.compare model=gpt strategies=[ddp,zero1,shard_grad_op,full_shard,hybrid_shard]
    python -m recipes.compare --estimate model.n_layer=12 estimate.worlds=[1,8,64]   # memory only, nothing runs
    python -m recipes.compare --plan plan.params=7.5e9 plan.nodes=16 plan.global_batch=512   # layouts that fit
    python -m recipes.compare --help | --cfg job | --info | --hydra-help             # Hydra's own flags
    minidist-compare                                                                 # installed: 2 processes
    minidist-compare --estimate                                                      # installed: from anywhere

Arguments are Hydra overrides of configs/compare.yaml (minidist.compare.config) and Hydra's flags
(minidist.recipes.hydra_cli, as the train recipe takes them), plus `--estimate` and `--plan`
(minidist.compare.plan_table); the work is minidist.compare.run. The command line is composed and checked before anything runs (a mistake is
one line, exit 64: runtime.UsageError). Outputs: <out_dir>/<name> (default outputs/compare-<timestamp>).
"""

from __future__ import annotations

import signal
import sys

from minidist.recipes import hydra_cli

ESTIMATE = "--estimate"
PLAN = "--plan"


def compose(args: list[str], config_dir: str | None = None,
            world: tuple[int | None, int | None] | None = None, estimate: bool = False):
    """configs/compare.yaml with overrides, on its schemas, checked; raises ConfigError (one line).
    world: (ranks, processes per node) of the run (default: torchrun's environment, or one process);
    estimate: check for `--estimate`'s worlds (estimate.worlds) instead."""
    from hydra.core.config_store import ConfigStore

    from minidist import runtime, strategies
    from minidist.cli.compose import ConfigError, compose_config
    from minidist.compare.config import CompareConfig, check
    from minidist.compare.rows import Row, check_rows_world

    ConfigStore.instance().store(name="compare_schema", node=CompareConfig)
    cfg = compose_config(args, config_name="compare", config_dir=config_dir)
    if cfg.model.name != "gpt" and not any(a.split("=", 1)[0].lstrip("+") == "data" for a in args):
        # the data follows the model where the command line names none: images for an image model
        cfg = compose_config([*args, "data=synthetic"], config_name="compare", config_dir=config_dir)
    world_size, local = (None, None) if estimate else runtime.launched_world() if world is None else world
    try:
        check(cfg)
        if world_size is not None:  # each tensor-parallel degree against the world (one line naming `strategies`)
            check_rows_world(cfg, world_size)
        for name in dict.fromkeys(Row.parse(row).base for row in cfg.strategies):  # each strategy's own rules
            key, options = f"strategy_options.{name}", cfg.strategy_options[name]
            if estimate:  # a group larger than a tabulated world is that whole world (minidist.compare.run)
                e = cfg.estimate
                strategies.get(name).check(options, key, list(e.worlds), e.gpus_per_node, "estimate.worlds")
            elif world_size is not None:
                strategies.get(name).check(options, key, [world_size], local)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return cfg


def check_command_line(argv: list[str], world_size: int | None, local_world_size: int | None) -> None:
    """Compose and check the command line at this world (minidist.recipes.torchrun, before the workers)."""
    args, _, estimate = _parse(argv)
    if not hydra_cli.is_informational(args):
        _compose_args(args, (world_size, local_world_size), estimate)


def console(argv: list[str] | None = None) -> None:
    """The console script minidist-compare: the README's world (minidist.recipes.launch: 2 processes, or every
    GPU, under minidist.recipes.torchrun); one process for --estimate and Hydra's informational flags."""
    from minidist.recipes import launch

    def one_process(argv: list[str]) -> bool:
        args, _, estimate = _parse(argv)
        return estimate or hydra_cli.is_informational(args)

    launch.console("minidist-compare", "minidist.recipes.compare", sys.argv[1:] if argv is None else list(argv),
                   main, one_process)


def main(argv: list[str] | None = None) -> None:
    """The comparison in this process's world; ends through runtime.run_main (one-line errors, exit status)."""
    from minidist import runtime

    runtime.run_main(lambda: _main(sys.argv[1:] if argv is None else list(argv)))


def _main(argv: list[str]) -> int:
    from minidist import runtime

    args, parser, estimate = _parse(argv)
    informational = hydra_cli.is_informational(args)
    cfg = _compose_args(args, (None, None) if informational else None, estimate)  # --cfg: for any world
    if informational:
        hydra_cli.informational(args, parser, "compare")
        return 0
    from minidist.compare import run

    if estimate == PLAN:
        from minidist.compare import plan_table

        print(plan_table.from_config(cfg))
        return 0
    if estimate:
        print(run.estimate_table(cfg))
        return 0
    with runtime.distributed(cfg.backend.value, cfg.timeout_s) as topo:
        result = run.compare(cfg, topo) or {}
    stopped = result.get("interrupted")  # the rows measured so far are saved: 128 + the signal, as a shell says
    return 128 + int(getattr(signal.Signals, stopped, signal.SIGINT)) if stopped else 0


def _parse(argv: list[str]):
    """(Hydra's args, its parser, which of --estimate and --plan was given: nothing runs for either, or None)."""
    args, parser = hydra_cli.parse([a for a in argv if a not in (ESTIMATE, PLAN)])
    return args, parser, PLAN if PLAN in argv else ESTIMATE if ESTIMATE in argv else None


def _compose_args(args, world, estimate: bool):
    from minidist.cli.compose import ConfigError

    if args.multirun:
        raise ConfigError("recipes.compare runs no sweep: it measures every strategy of strategies=[...] in "
                          "one job; drop --multirun")
    if args.config_path is not None:
        raise ConfigError("--config-path replaces minidist's configs; add a directory of your own configs "
                          "with --config-dir instead")
    return compose(list(args.overrides), args.config_dir, world, estimate)


if __name__ == "__main__":
    main()
