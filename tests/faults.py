"""Fault injection for tests, as trainer callbacks (fn(run, step_done)); the product carries none of it."""

from __future__ import annotations

import os
import time

from minidist.mesh import is_main

CRASH_MARKER = "crash_injected"


def stop_after(step: int):
    """Ask the run to stop (it checkpoints first) once `step` steps are done, as a preempted job would."""
    def callback(run, done: int) -> None:
        if done == step:
            run.request_stop()
    return callback


def crash_once(before_step: int):
    """The main process raises before `before_step`, once per run directory (a marker file remembers)."""
    def callback(run, done: int) -> None:
        marker = run.run_dir / CRASH_MARKER
        if done + 1 == before_step and is_main(run.layout) and not marker.exists():
            marker.write_text("the main process crashed here once, on purpose\n")
            raise RuntimeError(f"injected crash before step {before_step}")
    return callback


def crash_once_from_env():
    """crash_once(CRASH_AT_STEP) for recipes launched as subprocesses (tests/recipes/crashing_train.py)."""
    return crash_once(int(os.environ["CRASH_AT_STEP"]))


def slow_steps_from_env():
    """Every step takes STEP_SLEEP_S longer (tests/recipes/slow_train.py): a window for a signal to land in."""
    seconds = float(os.environ["STEP_SLEEP_S"])

    def callback(run, done: int) -> None:
        time.sleep(seconds)
    return callback
