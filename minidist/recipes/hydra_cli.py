"""Hydra's command line, shared by the recipes (train, compare): its flags, as @hydra.main gives them.

    args, parser = parse(argv)            # Hydra's own argument parser: overrides, --help, --cfg, --info, ...
    if is_informational(args):
        informational(args, parser, "compare")   # Hydra prints it, over minidist's configs (rank 0 only)

The recipes do not use @hydra.main itself: they compose and check every job first (a mistake is one
line, before any process group exists) and then run the jobs over one process group. Hydra's flags
and plugins are reached through hydra._internal (hydra-core is pinned to 1.3;
tests/recipes/test_hydra.py covers every path).
"""

from __future__ import annotations

import os


def parse(argv: list[str]):
    """(args, parser): Hydra's parser over argv; a bare `--cfg` (minidist's older spelling) is `--cfg job`."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    return parser.parse_args(_cfg_means_job(argv)), parser


def _cfg_means_job(argv: list[str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in ("--cfg", "-c") and (i + 1 == len(argv) or argv[i + 1] not in ("job", "hydra", "all")):
            out.append("job")
    return out


def is_informational(args) -> bool:
    """--help, --hydra-help, --cfg, --info, --shell-completion: Hydra prints something; no job runs."""
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion)


def informational(args, parser, config_name: str) -> None:
    """Hydra prints the informational flag's answer, on global rank 0 only (the others say nothing)."""
    if os.environ.get("RANK", "0") != "0":
        return
    run_hydra(args, parser, None, config_name)


def run_hydra(args, parser, task, config_name: str) -> None:
    """Hydra's own entry (what @hydra.main calls) over minidist's configs/<config_name>.yaml."""
    from hydra._internal.utils import _run_hydra

    from minidist.cli.config import CONFIG_DIR

    _run_hydra(args=args, args_parser=parser, task_function=task or _no_task, config_path=str(CONFIG_DIR),
               config_name=args.config_name or config_name)


def _no_task(cfg) -> None:
    raise AssertionError("informational commands run no job")
