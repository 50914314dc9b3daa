"""Run several lessons under one torchrun (one process-group start for all of them).

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons --all [--small]
    torchrun --standalone --nproc_per_node=2 -m recipes.lessons bucket_sweep no_sync
"""

from __future__ import annotations

import argparse
import importlib

from recipes.lessons import LESSONS
from recipes.lessons.common import run_lessons


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"lessons to run, of: {', '.join(LESSONS)}")
    parser.add_argument("--all", action="store_true", help="every lesson, in reading order")
    parser.add_argument("--small", action="store_true", help="small sizes and few repeats (CI)")
    args = parser.parse_args()
    names = list(LESSONS) if args.all else args.names
    unknown = [n for n in names if n not in LESSONS]
    if not names or unknown:
        parser.error(f"name lessons or pass --all; unknown: {unknown}; known: {', '.join(LESSONS)}")
    modules = [importlib.import_module(f"recipes.lessons.{n}") for n in names]
    titles = [f"lesson {LESSONS.index(n) + 1}: {n}: {m.TITLE}" for n, m in zip(names, modules)]
    run_lessons([m.run for m in modules], args.small, titles)


if __name__ == "__main__":
    main()
