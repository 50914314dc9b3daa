"""The process-group runtime: who am I, how many are we, which device and backend.

Every engine in minidist takes its process group explicitly; this module only
builds the first one. It reads what torchrun exports (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and, when none of that is set, starts a
world of one in this process, so the same script runs with and without torchrun.

    with minidist.runtime.distributed() as topo:
        model = minidist.DDP(net.to(topo.device), process_group=topo.group)

Backend "auto" picks nccl on cuda:LOCAL_RANK when CUDA is available and gloo on
the CPU otherwise. The device is set *before* init_process_group, because NCCL
binds its communicator to the current device when it is created.

Ending a program: run_main(body) runs a recipe's body and ends the process with its
status through exit_process (a process that ran gloo must not reach the interpreter's
teardown: see there). An error is one line (exit_on_error): a UsageError (a bad input,
the same on every rank) once per node and exit 64 (EXIT_USAGE), any other error once
per rank that met it and exit 1.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")

EXIT_USAGE = 64
"""Exit status of a bad input (sysexits' EX_USAGE): a configuration or command line that cannot run.
minidist.recipes.torchrun passes it on, so scripts can tell "fix the command" from "it crashed" (1)
and "preempted, requeue" (75, minidist.train.preemption.EXIT_PREEMPTED)."""


class UsageError(ValueError):
    """A bad input: the same on every rank (it comes from the command line, the config, or a decision
    the main process broadcast), so exit_on_error prints it once (local rank 0) and exits EXIT_USAGE."""


EXIT_STATUS_DIR_ENV = "MINIDIST_EXIT_STATUS_DIR"
"""Set by minidist.recipes.torchrun: exit_process records this worker's status there (file rank<RANK>),
the one thing torchrun cannot tell its caller after it was signalled."""

USAGE_QUIET_WAIT_S = 30.0
"""How long a rank that does not print a UsageError waits for torchrun to end it (see _wait_for_the_speaker)."""

_made_group = False
"""Whether this process ever created a process group (then it must end through exit_process)."""


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the job. Passed explicitly; never a global."""

    rank: int
    """Global rank, 0..world_size-1."""
    world_size: int
    """Number of processes in the job."""
    local_rank: int
    """Rank on this node; selects the GPU."""
    backend: str
    """The backend actually used: "gloo" or "nccl"."""
    device: torch.device
    """Where this rank computes: cuda:LOCAL_RANK with nccl, cpu with gloo."""
    group: dist.ProcessGroup
    """The default (world) process group."""

    @property
    def is_main(self) -> bool:
        """Rank 0 writes logs, checkpoints and plots."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def launched_world() -> tuple[int, int]:
    """(world size, processes per node) from torchrun's environment, before any process group
    exists; (1, 1) for a process started without torchrun."""
    world = _env_int("WORLD_SIZE", 1)
    return world, _env_int("LOCAL_WORLD_SIZE", world)


def resolve_backend(backend: str) -> str:
    """Map "auto" to nccl when CUDA is usable, else gloo; validate explicit choices."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("backend='nccl' needs CUDA GPUs; none is visible here. Use backend=gloo or auto.")
    return backend


def init(backend: str = "auto", timeout_s: float = 300.0) -> Topology:
    """Initialise the default process group from torchrun's environment, or as a world of one.

    timeout_s bounds every collective: a rank that never arrives turns into an
    error after this long instead of a silent hang.
    """
    global _made_group
    backend = resolve_backend(backend)
    timeout = datetime.timedelta(seconds=timeout_s)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        _made_group = True
        if launched:
            kwargs = {"device_id": device} if backend == "nccl" else {}
            store = _restart_safe_store(rank, world_size, timeout)
            if store is not None:
                kwargs |= {"store": store, "rank": rank, "world_size": world_size}
            dist.init_process_group(backend, timeout=timeout, **kwargs)
        else:
            # A world of one with an in-memory store: no ports, no environment.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return Topology(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        backend=backend,
        device=device,
        group=dist.group.WORLD,
    )


def _restart_safe_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store | None:
    """After torchrun restarted the workers, a store whose keys are this attempt's alone.

    torchrun's agent keeps serving the same TCPStore across restarts, so the
    keys the crashed attempt wrote (each rank's gloo address) are still there; a
    restarted rank can read its peer's *old* address before the peer rewrites
    it and fail with "connectFullMesh ... Connection refused". Prefixing every
    key with the attempt number (TORCHELASTIC_RESTART_COUNT) makes the stale
    keys invisible. The first attempt uses torch's own env:// store unchanged.
    """
    attempt = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if attempt == 0:
        return None
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0 and not agent_hosts, timeout=timeout)
    return dist.PrefixStore(f"minidist/attempt_{attempt}", store)


def shutdown() -> None:
    """Destroy the default process group if one exists (safe to call twice)."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed(backend: str = "auto", timeout_s: float = 300.0) -> Iterator[Topology]:
    """init() on entry; destroy the process group on normal exit and on exceptions."""
    topo = init(backend, timeout_s)
    try:
        yield topo
    finally:
        shutdown()


def exit_process(code: int = 0) -> None:
    """End a worker now: flush output, then leave without the interpreter's teardown.

    Call it after shutdown(). Why: a gloo collective returns to Python as soon as its
    Work completes, but gloo's worker thread (pt_gloo_runloop) still holds the Work and
    drops it a moment later; the Work's tensors are Python objects, so dropping them takes
    the GIL. If the main thread has meanwhile left the script, the interpreter is
    finalizing, and a thread that asks for the GIL then is ended by pthread_exit, whose
    unwinding through the Work's destructor calls std::terminate: "terminate called without
    an active exception", exit -6 (seen with torch 2.14 + gloo: after a plain all_reduce, a
    few runs in ten; torchrun then counts a finished run as a crash). destroy_process_group
    does not prevent it: the group lives on while anything (a Topology, a mesh) refers to it,
    and its threads with it (the race of pytorch/pytorch#179291). Everything the program owns
    (process group, logger, files) is closed before this, so skipping the teardown loses
    nothing. Any script of your own that ran gloo collectives should end so too (or run its
    main through run_main).
    """
    status_dir = os.environ.get(EXIT_STATUS_DIR_ENV)
    if status_dir:
        try:
            with open(os.path.join(status_dir, f"rank{os.environ.get('RANK', '0')}"), "w") as f:
                f.write(str(code))
        except OSError:
            pass  # the launcher's directory is gone: it no longer asks
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def finish(code: int = 0) -> None:
    """The last call of a program: exit_process(code) if this process made a process group
    (see there) or code != 0; else return, so that an in-process caller (a test) goes on."""
    if _made_group or code:
        exit_process(code)


def run_main(body: Callable[[], int | None]) -> None:
    """Run a program's body and end the process the minidist way: its status (None = 0) through
    finish(); an error as one line (exit_on_error); Ctrl-C as "interrupted"; SystemExit's status."""
    try:
        code = body()
    except KeyboardInterrupt:
        exit_on_error(KeyboardInterrupt("interrupted"))
    except SystemExit as exc:  # argparse's --help (0) or its usage error (2), printed already
        if isinstance(exc.code, str):
            _say(exc.code)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except Exception as exc:  # noqa: BLE001 - one line; MINIDIST_TRACEBACK=1 for the trace
        exit_on_error(exc)
    shutdown()
    finish(code or 0)


def rank_prefix() -> str:
    """'[rank r/N] ' when a process group exists, else ''."""
    if dist.is_initialized():
        return f"[rank {dist.get_rank()}/{dist.get_world_size()}] "
    return f"[rank {os.environ.get('RANK', '0')}] " if "RANK" in os.environ else ""


def _say(line: str) -> None:
    """One line on stderr in one write: lines of several ranks sharing a terminal never run together."""
    sys.stderr.flush()
    os.write(2, (line.rstrip("\n") + "\n").encode(errors="replace"))


def _speaks_for_all() -> bool:
    """Local rank 0 on torchrun's first attempt (or a process outside torchrun): the one process per
    node that reports a UsageError, which every rank of every attempt would report alike."""
    return _env_int("LOCAL_RANK", 0) == 0 and _env_int("TORCHELASTIC_RESTART_COUNT", 0) == 0


def _wait_for_the_speaker() -> None:
    """A rank that stays quiet about a UsageError lets local rank 0 say it first: if this rank exited
    at once, torchrun would SIGTERM the others, local rank 0 perhaps before it printed. torchrun
    ends this wait (SIGTERM, its default action) as soon as the speaker has exited."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a preemption handler must not catch torchrun's SIGTERM
    time.sleep(USAGE_QUIET_WAIT_S)


def exit_on_error(exc: BaseException) -> None:
    """Print one line naming the error and exit, without a stack trace.

    A UsageError (a bad input: the same on every rank) is printed once per node, by local rank 0
    on torchrun's first attempt, and exits EXIT_USAGE on every rank; any other error is
    printed by each rank that meets it ("[rank r/N] error: ..."), and exits 1. Set
    MINIDIST_TRACEBACK=1 to see the full trace. The flight recorder dumps this rank's last
    collectives first, and a backend timeout is reported as the collective that did not
    complete and the ranks that never reached it.
    """
    from minidist.comm import flight_recorder  # local: this module imports nothing of minidist at load

    usage = isinstance(exc, UsageError)
    if not usage:
        exc = flight_recorder.on_error(exc)
    if os.environ.get("MINIDIST_TRACEBACK"):
        raise exc
    if not usage or _speaks_for_all():
        # Backend errors (gloo, NCCL) append C++ frames after the first line: keep the message only.
        message = str(exc).strip().split("\n", 1)[0]
        _say(f"{rank_prefix() if not usage else ''}error: {type(exc).__name__}: {message}")
    shutdown()
    if usage and not _speaks_for_all():
        _wait_for_the_speaker()
    exit_process(EXIT_USAGE if usage else 1)
