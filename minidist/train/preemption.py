"""Preemption: a signal asks the job to stop; the ranks agree at a step boundary, checkpoint, and exit.

SLURM and cloud schedulers send SIGTERM (SLURM: `--signal`) some time before they kill a
job, and torchrun forwards it to its workers. A handler that only sets a flag is safe at
any moment; acting on it is not: one rank that checkpointed and left while another began
the next step would leave that one waiting in its first all_reduce. So every step issues
one 1-element all_reduce(MAX) of the local flag *before* its work and reads it *after*:
it travels while the step computes, and every rank sees the same answer after the same
step. The cost is that tiny collective (~alpha, hidden) and one host read per step.

The run then writes a checkpoint, a PREEMPTED marker in its directory, and the recipe exits
with EXIT_PREEMPTED (75, sysexits' "temporary failure, try again"), so that torchrun's
restart or a SLURM requeue (launch/slurm.sbatch) resumes it with at most the current step lost.

Ctrl-C is SIGINT, and the default signals include it (trainer.preempt_signals): a user who
interrupts a run keeps it, as a scheduler's SIGTERM does. A second SIGINT while the first is
pending stops at once (KeyboardInterrupt, exit 130, no checkpoint of the step in progress), as
Lightning's second Ctrl-C does. Under torchrun the terminal's Ctrl-C reaches the agent only (its
workers run in sessions of their own), which forwards it once; minidist.recipes.torchrun turns a
second Ctrl-C into the end of the workers.
"""

from __future__ import annotations

import os
import signal
import threading

import torch

from minidist import comm

EXIT_PREEMPTED = 75


def signal_number(name: str) -> signal.Signals:
    """signal.SIGTERM for "SIGTERM" (or "TERM"); ValueError naming the valid ones otherwise."""
    key = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
    if key not in signal.Signals.__members__:
        raise ValueError(f"unknown signal {name!r}; use e.g. SIGTERM, SIGUSR1, SIGUSR2, SIGINT")
    return signal.Signals[key]


class PreemptionWatch:
    """Catches `signals` in this process and tells, at each step boundary, whether any rank caught one.

    announce: the line said on stderr when the first SIGINT arrives, what happens next (the main
    process's; None: nothing)."""

    def __init__(self, signals: list[str], device: torch.device, announce: str | None = None):
        self.device = device
        self.announce = announce
        self.caught: str | None = None
        self.interrupts = 0
        self._previous: dict[signal.Signals, object] = {}
        self._flag: torch.Tensor | None = None
        self._work = None
        if threading.current_thread() is threading.main_thread():  # Python only signals the main thread
            for sig in map(signal_number, signals):
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        self.caught = self.caught or signal.Signals(signum).name
        if signum != signal.SIGINT:
            return
        self.interrupts += 1
        if self.interrupts > 1:
            raise KeyboardInterrupt("interrupted twice: stopped at once")
        if self.announce:  # os.write: a handler writing through sys.stderr could re-enter a write it interrupted
            os.write(2, f"\n{self.announce}\n".encode())

    def start_step(self) -> None:
        """Before the step's work: launch the vote (async, so the step hides it)."""
        if not self._previous:
            return
        self._flag = torch.tensor([1.0 if self.caught else 0.0], device=self.device)
        self._work = comm.all_reduce(self._flag, comm.ReduceOp.MAX, async_op=True)

    def should_stop(self) -> bool:
        """After the step: did any rank catch a signal before this step's vote?"""
        if self._work is None:
            return False
        self._work.wait()
        self._work = None
        return bool(self._flag.item())

    def vote(self) -> bool:
        """start_step() and should_stop() at once: a boundary with nothing to hide the vote behind."""
        self.start_step()
        return self.should_stop()

    def close(self) -> None:
        """Wait out a vote in flight and give the signals their previous handlers back."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
