"""How a recipe's processes start: the world a console script launches, and the command that continues a run.

    console("minidist-train", "minidist.recipes.train", argv, main, one_process)   # the console scripts

The README runs every recipe under torchrun at 2 processes (`make train`, `make tour`,
`torchrun --nproc_per_node=2 -m recipes.compare`), and the installed commands do the same, as
Lightning's Trainer(devices=N) starts its own processes: run from a shell (no torchrun around
them), minidist-train, minidist-compare and minidist-tour start minidist.recipes.torchrun in
this process with `--standalone --nproc_per_node=NPROC -m <module> <arguments>` (NPROC: the
environment variable `make` reads too; default every GPU with CUDA, else 2 CPU processes), and
say so in their first line. They stay one process where one is what the command means: Hydra's
informational flags (--help, --cfg, ...), the comparison's --estimate, a training command whose
jobs all use strategy=single, and NPROC=1.

The command that continues a run (printed when it stops on a signal, and in the refusals that
name one) is the command line that launched it: MINIDIST_LAUNCH names the launcher (set by the
console scripts and by minidist.recipes.torchrun), else it is inferred from this process
(torchrun's environment, or `python -m <module>`).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Callable

from minidist.recipes import torchrun
from minidist.recipes.torchrun import LAUNCH_ENV

NPROC_ENV = "NPROC"
"""Processes a console script starts (as `NPROC=3 make tour`)."""



def launched() -> bool:
    """Under torchrun (or a launcher that set torchrun's variables): the world exists already."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def default_nproc() -> int:
    """Processes for a console script: $NPROC, else every CUDA GPU, else 2 CPU processes (gloo)."""
    raw = os.environ.get(NPROC_ENV, "")
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            from minidist.runtime import UsageError
            raise UsageError(f"{NPROC_ENV}={raw!r}: the number of processes to start, an integer >= 1")
        return int(raw)
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def console(name: str, module: str, argv: list[str], main: Callable[[list[str]], None],
            one_process: Callable[[list[str]], bool]) -> None:
    """A console script's entry: main(argv) in this process when it is launched already or one process is
    what argv means (one_process(argv); it may raise UsageError: one line, exit 64); else torchrun at
    default_nproc() processes over `module`, its first line saying so."""
    from minidist import runtime

    if launched():
        return main(argv)
    try:
        nproc = default_nproc()
        single = nproc == 1 or one_process(argv)
    except runtime.UsageError as exc:
        runtime.exit_on_error(exc)
    if single:
        return main(argv)
    print(f"{name}: {nproc} processes (torchrun --standalone --nproc_per_node={nproc}); {NPROC_ENV}=N for "
          f"another count, {NPROC_ENV}=1 for one process", flush=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default for its workers, without its warning
    os.environ[LAUNCH_ENV] = f"{NPROC_ENV}={nproc} {name}" if os.environ.get(NPROC_ENV) else name  # to continue a run
    torchrun.main(["--standalone", f"--nproc_per_node={nproc}", "-m", module, *argv])


def launcher() -> str:
    """The command that launched this process, up to the recipe's arguments (module docstring)."""
    if os.environ.get(LAUNCH_ENV):
        return os.environ[LAUNCH_ENV]
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    target = f"-m {spec.name}" if spec is not None and spec.name else shlex.quote(sys.argv[0])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        world = int(os.environ.get("WORLD_SIZE", 1))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        nodes = "--standalone" if world == local else f"--nnodes={world // local} --rdzv-endpoint=<host:port>"
        return f"torchrun {nodes} --nproc_per_node={local} {target}"
    return f"python {target}"


def continue_command(overrides: list[str] | tuple[str, ...], run_dir: Path | None) -> str:
    """The launching command with these overrides, resume=auto, and the run's name when the command line
    named none (a new run's name carries its time: without it resume=auto would look for the latest run
    of the same config, perhaps another one)."""
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "resume"]
    named = any(o.split("=", 1)[0] in ("name", "hydra.run.dir") for o in keep)
    extra = [] if named or run_dir is None else [f"name={run_dir.name}"]
    return " ".join([launcher(), *map(shlex.quote, keep + extra + ["resume=auto"])])
