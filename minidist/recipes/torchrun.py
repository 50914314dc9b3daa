"""torchrun, ending as the workers did: their exit status, and no launcher traceback after their one line.

    python -m minidist.recipes.torchrun --standalone --nproc_per_node=2 -m recipes.train strategy=full_shard

The arguments are torchrun's, unchanged: torch.distributed.run.main runs in this process (same
rendezvous, restarts, signal forwarding, logs). `make train`, `make tour` and launch/*.sh start
jobs through it. What it changes, and why:

1. A worker fails: torchrun raises ChildFailedError, so it prints a ~35-line traceback and failure
   table after the worker's own one-line error, and exits 1 whatever the worker's status was. Here
   the job exits with the first failed worker's status (runtime.EXIT_USAGE = 64: a bad input; 1: an
   error; 75: preempted) and prints nothing more, except one line when a worker died by a signal
   (it could not say why itself): status 128 + the signal's number.
2. torchrun is signalled (SIGTERM from SLURM, docker or Ctrl-C): it forwards the signal to its
   workers, waits up to --shutdown-timeout (default 30 s) for them to exit, then raises
   SignalException (a traceback, exit 1). Workers that checkpointed on the signal exit 75
   (minidist.train.preemption); each worker's runtime.exit_process leaves its status in a
   directory named by MINIDIST_EXIT_STATUS_DIR, so here the job exits 75 when they did, else
   128 + the signal's number, without the traceback.
3. The entry module's command line is checked before any worker starts, when the module offers
   check_command_line(argv, world_size, local_world_size) (minidist.recipes.train and compare do):
   a bad input is one line here, exit 64, instead of a line from rank 0 of every restart attempt.
4. Ctrl-C. The terminal's SIGINT reaches this process only (torch starts each worker in a session
   of its own), and torchrun forwards it once: the workers finish their step, checkpoint and exit
   75 (minidist.train.preemption), and so does the job. A second Ctrl-C kills the workers (SIGKILL
   to each one's process group: "stops at once") and the job exits 130; under plain torchrun it
   would only make torchrun signal them again and wait again (CtrlC).
5. torchrun's own log lines about what it reports itself ("Sending process ... closing signal",
   "failed (exitcode: ...)", "Received ... death signal") are left out: the workers' one line and
   this exit status say it. Every other torchrun line (its warnings, LOGLEVEL) stays.

The workers learn the command that launched them (minidist.recipes.launch.LAUNCH_ENV), for the
line that says how to continue a stopped run.
"""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from minidist import runtime

LAUNCH_ENV = "MINIDIST_LAUNCH"
"""The launcher's command up to the recipe's own arguments, for the workers' "continue with" line, e.g.
`minidist-train` or `python -m minidist.recipes.torchrun --standalone --nproc_per_node=2 -m recipes.train`
(minidist.recipes.launch reads it)."""

REPORTED_HERE = ("Sending process %s closing signal", "failed (exitcode: %s)", "Received %s death signal",
                 "Closing process %s via signal")
"""torchrun's log messages (their format strings' beginnings) that this launcher's exit status replaces."""


def main(argv: list[str] | None = None) -> None:
    """torchrun's command line; exits with the status described in the module docstring."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    _precheck(args, torchrun)
    _quiet_torchrun()
    status_dir = tempfile.mkdtemp(prefix="minidist-status-")
    os.environ[runtime.EXIT_STATUS_DIR_ENV] = status_dir  # the workers inherit the agent's environment
    own = argv[:len(argv) - len(args.training_script_args)]
    if not os.environ.get(LAUNCH_ENV):
        python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
        os.environ[LAUNCH_ENV] = shlex.join([python, "-m", "minidist.recipes.torchrun", *own])
    ctrl_c = CtrlC(SignalException)
    argv = ctrl_c.take_over(args, argv, own)
    try:
        torchrun.main(argv)
        code = 0
    except ChildFailedError as exc:
        code = _failed_status(exc)
    except SignalException as exc:
        code = 128 + int(exc.sigval) if ctrl_c.killed else _signalled_status(exc.sigval, Path(status_dir))
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    # Nothing is left to close (the workers are gone, the rendezvous over): leave without the interpreter's
    # teardown, which costs ~1 s with torch loaded, at the end of every job and of every bad command line.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class CtrlC:
    """SIGINT in the launcher: the first is what torchrun makes of it (SignalException: it forwards SIGINT
    to the workers and waits up to --shutdown-timeout for them); a second kills the workers at once.

    torchrun's own handler cannot do the second: a SignalException raised inside its wait for the workers
    runs its cleanup again, which signals them with SIGTERM and waits again. So SIGINT is taken out of
    torchrun's --signals-to-handle (where the torch version has the option, and the user left SIGINT in it)
    and handled here."""

    def __init__(self, signal_exception: type):
        self.signal_exception = signal_exception
        self.count = 0
        self.killed = 0

    def take_over(self, args, argv: list[str], own: list[str]) -> list[str]:
        """without_sigint(...), and this handler installed where SIGINT was taken from torchrun."""
        out = without_sigint(args, argv, own)
        if out is not argv:
            signal.signal(signal.SIGINT, self)
        return out

    def __call__(self, signum: int, frame) -> None:
        self.count += 1
        if self.count == 1:
            raise self.signal_exception(f"Process {os.getpid()} got signal: {signum}", sigval=signal.SIGINT)
        if not self.killed:
            self.killed = _kill_workers()


def without_sigint(args, argv: list[str], own: list[str]) -> list[str]:
    """torchrun's argv with SIGINT taken out of --signals-to-handle (placed after the user's options, before
    the script); argv itself where torchrun has no such option (older torch) or its list has no SIGINT.
    own: argv up to the script's arguments."""
    listed = [s.strip() for s in (getattr(args, "signals_to_handle", None) or "").split(",")]
    if "SIGINT" not in listed:
        return argv
    script = len(own) - 1 - (1 if args.module and own[-2:-1] in (["-m"], ["--module"]) else 0)
    rest = ",".join(s for s in listed if s != "SIGINT")
    return [*own[:script], f"--signals-to-handle={rest}", *argv[script:]]


def _quiet_torchrun() -> None:
    """Leave out torchrun's lines about what this launcher reports itself (REPORTED_HERE)."""
    def keep(record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(REPORTED_HERE))

    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).addFilter(keep)


def _workers() -> list[int]:
    """This process's live children (torchrun's workers), from /proc (Linux; elsewhere none are found)."""
    me, out = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _kill_workers() -> int:
    """SIGKILL every worker (each in its own process group, as torch starts them) and say so; how many."""
    pids = _workers()
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if pids:
        runtime._say(f"torchrun: stopped at once (a second Ctrl-C): {len(pids)} worker(s) killed, without a "
                     f"checkpoint of the step in progress; the latest complete checkpoint is kept")
    return len(pids)


def _precheck(args, torchrun) -> None:
    """The entry module's check_command_line at torchrun's world size (exit 64 with one line)."""
    if not args.module or args.no_python:
        return
    try:
        check = getattr(importlib.import_module(args.training_script), "check_command_line", None)
    except ImportError:
        return  # torchrun's workers will say so
    if check is None:
        return
    local = torchrun.determine_local_world_size(args.nproc_per_node)
    min_nodes, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    world = local * max_nodes if min_nodes == max_nodes else None  # elastic: known after the rendezvous
    try:
        check(list(args.training_script_args), world, local)
    except runtime.UsageError as exc:
        runtime.exit_on_error(exc)
    except Exception:  # noqa: BLE001 - the check itself failed: the workers meet it too, and say it in one line
        pass


def _failed_status(exc) -> int:
    """The status of the worker that failed first by itself; one line if a signal ended it (it could not
    speak). torchrun SIGTERMs the other workers after a failure, within the same second (its
    timestamps' resolution), so a worker that exited with a status, then one killed by another
    signal, come before those it ended."""
    def cause(item):
        rank, failure = item
        code = failure.exitcode
        return (0 if code > 0 else 1 if code != -signal.SIGTERM else 2), failure.timestamp, rank

    rank, failure = min(exc.failures.items(), key=cause)
    if failure.exitcode >= 0:
        return failure.exitcode or 1
    sig = -failure.exitcode
    runtime._say(f"torchrun: rank {rank} (pid {failure.pid}) was killed by {_signame(sig)}")
    return 128 + sig


def _signalled_status(sigval: signal.Signals, status_dir: Path) -> int:
    """75 if the workers checkpointed on the signal and said so, else 128 + the signal's number."""
    from minidist.train.preemption import EXIT_PREEMPTED

    codes = [f.read_text().strip() for f in status_dir.glob("rank*")]
    return EXIT_PREEMPTED if str(EXIT_PREEMPTED) in codes else 128 + int(sigval)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


if __name__ == "__main__":
    main()
