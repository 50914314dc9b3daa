"""The comparison's progress on the main process, as tqdm shows training's: a bar over every strategy's
phases whose description names the strategy and phase now running, and a line per finished strategy.

    progress = Progress(cfg.strategies, enabled=is_main)
    progress.phase("ddp", "warm-up")        # at the start of each phase (minidist.compare.measure.PHASES)
    progress.done("ddp")                    # its line: "[1/8] ddp measured in 4.2 s"
    progress.close()

On stderr, as the trainer's bar, so the tables on stdout stay what scripts read.
"""

from __future__ import annotations

import sys
import time

from minidist.compare.measure import PHASES


class Progress:
    def __init__(self, strategies: list[str], enabled: bool):
        from tqdm import tqdm

        self.strategies = list(strategies)
        # a bar of fixed width: a line as wide as the terminal wraps when tqdm.write clears it
        self.bar = tqdm(total=len(self.strategies) * len(PHASES), desc="loading the data, calibrating the link",
                        file=sys.stderr, mininterval=0, disable=not enabled,
                        bar_format="{desc} |{bar:24}| {n_fmt}/{total_fmt} phases [{elapsed}<{remaining}]")
        self.bar.refresh()
        self._current, self._started, self._seen = None, 0.0, 0
        """The strategy running, when it started, how many of its phases started (one bar step each)."""

    def _label(self, name: str) -> str:
        return f"[{self.strategies.index(name) + 1}/{len(self.strategies)}] {name}"

    def phase(self, name: str, what: str) -> None:
        """`what` of strategy `name` starts now (the previous phase, if any, is done)."""
        if name != self._current:
            self._current, self._started, self._seen = name, time.perf_counter(), 0
        if self._seen:
            self.bar.update(1)
        self._seen += 1
        self.bar.set_description_str(f"{self._label(name)}: {what}", refresh=True)

    def done(self, name: str) -> None:
        """Strategy `name` is measured: its remaining bar steps (a phase it skipped: memory=false) and its line."""
        self.bar.update(len(PHASES) - self._seen + 1)
        if not self.bar.disable:  # tqdm.write is a class method: it writes for a disabled bar too
            self.bar.write(f"{self._label(name)} measured in {time.perf_counter() - self._started:.1f} s",
                           file=sys.stderr)
        self._current = None

    def close(self) -> None:
        self.bar.close()
