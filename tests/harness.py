"""A pool of long-lived gloo worker processes that runs test bodies on every rank.

Starting N Python processes that import torch costs seconds; doing it per test
would not fit hundreds of tests on 2 cores. So a pool of `world_size` workers is
spawned once per pytest session (per world size), joins one gloo process group
and then runs test bodies on request:

    results = pool.run(body, arg1, arg2)   # body(arg1, arg2) on every rank

`body` must be a module-level function (it is pickled by reference). It runs
with the default process group initialised; the value it returns on each rank
comes back in rank order.

Bounded time, always: a rank that raises, dies or does not answer within
`timeout` fails the test with a message naming the rank; the pool is then torn
down (its process group may be mid-collective) and a fresh one starts for the
next test. A warning emitted by a body fails the test too, unless the caller
passes allow_warnings=True.

Writing fast tests (the whole suite has 5 minutes on 2 cores, venv included):
- A new interpreter costs ~2.5 s of CPU (torch + minidist imported), a torchrun
  launch 3 of them or more, a world of 4 on 2 cores twice the CPU of a world of 2.
  So multi-process bodies run here (run_dist), at world 2; world 4 only where the
  claim depends on N or needs a 2-D mesh; world 8 once, where three dimensions meet.
- A subprocess or torchrun only where the command line itself is what is tested,
  one launch checking everything that command line decides; what the workers
  compute is checked in the pool (see tests/recipes/test_tp_recipe.py).
- Several cases of one claim in one body (a loop, results returned as a dict),
  not one test per case: each test is a round trip to every rank.
- Tiny models (experiment=gpt_tiny, a few steps): the claim, not the size, is tested.
  A training run costs ~1 s of fixed work (compose, evaluation, model.pt, plot); a body composes
  its configuration with compose_once (below): Hydra's ~90 ms of CPU once per world, not per rank.
- A test whose claim is a measured time (or a memory peak whose instant gloo's threads decide) is
  marked @pytest.mark.alone: `make test` runs two pytest-xdist workers, each with its own pools,
  whose ranks share the 2 cores (tests/conftest.py), and nothing runs beside an alone test.
- Budget: ~5 s per test file; say in the commit message what a slow test buys.
  `pytest --durations=20 tests/<dir>` under the CPU lock shows where time goes.
"""

from __future__ import annotations

import datetime
import gc
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import tempfile
import time
import traceback
import warnings

WORKER_PG_TIMEOUT_S = 60.0
"""gloo's own timeout inside workers: a collective stuck longer than this raises."""

STARTUP_TIMEOUT_S = 120.0
"""Starting workers and joining their process group on a loaded 2-core machine can take a while."""

EXIT_GRACE_S = 5.0
"""How long closing a pool waits for its workers to leave before it kills them (all of them together)."""

PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "minidist", "minidist.train", "minidist.compare",
           "minidist.models.resnet", "matplotlib.pyplot", "tests.harness"]
"""Imported once, by the forkserver, before it forks any worker: a worker starts in ~0.1 s instead of the
~2.5 s of CPU that importing torch and minidist costs each spawned process (6 workers = 15 s on 2 cores),
and a body that trains a ResNet (torchvision, ~1.5 s) or plots curves (matplotlib, ~0.5 s) imports nothing.
torch._dynamo (~1.3 s) is what torch.optim imports at an optimizer's first step, in every worker that trains."""

IDLE_CLOSE_S = 30.0
"""A pool unused for this long is closed (PoolManager.close_idle, after each test) and started again if a later
test needs its world size. An idle rank is not free: gloo's transport thread wakes every 10 ms (epoll_wait's
timeout), 2-3.5 ms of CPU per second per rank (measured on idle pools), while starting a rank again costs ~10 ms
of CPU (a fork of the preloaded forkserver) plus the ~0.2 s its first body spends importing what the forkserver
did not (Hydra, the test modules). Measured over a run, one each: the pools' processes 441 -> 409 s of CPU."""

ORPHAN_POLL_S = 5.0
"""How often an idle worker checks that the session that started it is still there: a pytest killed
mid-run (Ctrl-C twice, a CI time-out) closes no pool, and its workers would otherwise live on, holding
their process group's threads and memory."""

GRACE_AFTER_ERROR_S = 3.0
"""After one rank fails, how long the others get to report before the pool is killed."""


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _destroy_groups_since(before: set) -> None:
    """Destroy the process groups a body created (a DeviceMesh's dimensions, new_group's): each gloo group keeps a
    transport thread that wakes every 10 ms for as long as the group lives (and two run-loop threads), 2-3.5 ms
    of CPU per second. Left to accumulate, a rank of the world-4 pool held 22 more threads after the lessons
    alone, and over a whole run the pools' ranks spent ~70 s of CPU between bodies (process_time logged around
    each body). Not after a failed body: that pool is killed."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    # _world.pg_map is private: torch has no public list of the live groups (pinned below 2.15 in pyproject.toml)
    for group in [g for g in c10d._world.pg_map if g not in before]:
        dist.destroy_process_group(group)


def _worker_main(rank: int, world_size: int, store_path: str, tasks, results, session_pid: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    torch.set_num_threads(1)  # as torchrun does (OMP_NUM_THREADS=1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=WORKER_PG_TIMEOUT_S))
    gc.freeze()  # what is imported so far lives for good: gc.collect() in a body skips it (0.17 s -> ms)
    results.put((rank, ("ready", None), []))
    while True:
        try:
            task = tasks.get(timeout=ORPHAN_POLL_S)
        except queue.Empty:
            if not _alive(session_pid):  # pytest died without closing the pool (the forkserver lives on: the
                break                    # workers hold its liveness pipe, so only the session's pid tells)
            continue
        if task is None:
            break
        fn, args, kwargs = task
        groups = set(c10d._world.pg_map)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = fn(*args, **kwargs)
                _destroy_groups_since(groups)
                outcome = ("ok", value)
            except BaseException:  # noqa: BLE001 - report everything, including AssertionError
                outcome = ("error", traceback.format_exc())
        seen = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
        try:
            results.put((rank, outcome, seen))
        except Exception:  # unpicklable return value
            results.put((rank, ("error", f"return value not picklable: {traceback.format_exc()}"), seen))
    dist.destroy_process_group()
    results.close()
    results.join_thread()  # every result reached the pipe
    os._exit(0)  # no interpreter teardown: it races gloo's worker thread (minidist.runtime.exit_process)


def _context():
    """forkserver with PRELOAD imported: a fresh process (not a fork of pytest's, which holds
    threads), whose children start with torch and minidist already imported."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class DistTestError(AssertionError):
    """A multi-process test body failed, hung or died on some rank."""


class WorkerPool:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self.broken_by: str | None = None
        """What made this pool unusable (the test body that failed, hung or killed a rank)."""
        ctx = _context()
        self._dir = tempfile.TemporaryDirectory(prefix="minidist-pool-")
        store = os.path.join(self._dir.name, "store")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._procs = [
            ctx.Process(target=_worker_main, args=(r, world_size, store, self._tasks[r], self._results, os.getpid()),
                        daemon=True, name=f"minidist-rank{r}")
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self.broken = False
        self._wait_ready()
        self.last_used = time.monotonic()

    def _wait_ready(self) -> None:
        """Block until every worker has joined the process group (bounded)."""
        ready: set[int] = set()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(ready) < self.world_size:
            try:
                rank, _, _ = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
                ready.add(rank)
            except queue.Empty:
                self.close(kill=True)
                raise DistTestError(f"worker pool of {self.world_size} did not start within {STARTUP_TIMEOUT_S:.0f}s; "
                                    f"ready ranks: {sorted(ready)}") from None

    def run(self, fn, *args, timeout: float = 120.0, allow_warnings: bool = False, **kwargs) -> list:
        """Run fn(*args, **kwargs) on every rank; return the values in rank order."""
        if self.broken:
            raise DistTestError("worker pool is broken; it should have been replaced")
        for q in self._tasks:
            q.put((fn, args, kwargs))
        got: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        first_error_at = None
        while len(got) < self.world_size:
            now = time.monotonic()
            limit = deadline if first_error_at is None else min(deadline, first_error_at + GRACE_AFTER_ERROR_S)
            if now >= limit:
                break
            try:
                rank, outcome, seen = self._results.get(timeout=min(0.2, limit - now))
                got[rank] = (outcome, seen)
                if outcome[0] == "error" and first_error_at is None:
                    first_error_at = time.monotonic()
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive() and r not in got]
                if dead:
                    self.close(kill=True, why=fn.__name__)
                    raise DistTestError(f"{fn.__name__}: rank(s) {', '.join(f'{r} (exit code {c})' for r, c in dead)} "
                                        f"died without reporting")
        errors = [(r, o[1]) for r, (o, _) in sorted(got.items()) if o[0] == "error"]
        missing = [r for r in range(self.world_size) if r not in got]
        if errors or missing:
            self.close(kill=True, why=fn.__name__)
            msg = [f"{fn.__name__} failed at world size {self.world_size}"]
            msg += [f"--- rank {r} raised:\n{tb}" for r, tb in errors]
            if missing:
                why = "after another rank failed" if errors else f"within {timeout:.0f}s"
                msg.append(f"--- rank(s) {missing} did not finish {why} (hung in a collective?)")
            raise DistTestError("\n".join(msg))
        if not allow_warnings:
            warned = [(r, w) for r, (_, seen) in sorted(got.items()) for w in seen]
            if warned:
                raise DistTestError(f"{fn.__name__} emitted warnings:\n" + "\n".join(f"rank {r}: {w}" for r, w in warned))
        self.last_used = time.monotonic()
        return [got[r][0][1] for r in range(self.world_size)]

    def close(self, kill: bool = False, why: str | None = None) -> None:
        """Ask every worker to leave (or kill them at once: a broken pool may be mid-collective)."""
        self.broken, self.broken_by = True, why
        if not kill:
            for q in self._tasks:
                q.put(None)
            deadline = time.monotonic() + EXIT_GRACE_S
            for p in self._procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._dir.cleanup()


class PoolManager:
    """One live pool per world size, replaced whenever a test breaks it; every start is recorded."""

    def __init__(self):
        self._pools: dict[int, WorkerPool] = {}
        self.starts: list[tuple[int, float, str | None]] = []
        """(world size, seconds to start, what broke the pool it replaced) for every pool started."""
        self.idle_closes = 0

    def get(self, world_size: int) -> WorkerPool:
        pool = self._pools.get(world_size)
        if pool is None or pool.broken:
            t0 = time.monotonic()
            replaced = (pool.broken_by or "a failed pool") if pool is not None else None
            pool = self._pools[world_size] = WorkerPool(world_size)
            self.starts.append((world_size, time.monotonic() - t0, replaced))
        return pool

    def summary(self) -> str:
        """One line for pytest's terminal summary: how many worlds were started, and why any was restarted."""
        seconds = sum(s for _, s, _ in self.starts)
        worlds = ", ".join(f"{w}: {sum(1 for x, _, _ in self.starts if x == w)}"
                           for w in sorted({w for w, _, _ in self.starts}))
        line = f"worker pools: {len(self.starts)} started in {seconds:.1f} s (by world size {worlds})"
        rebuilt = [f"{why} (world {w})" for w, _, why in self.starts if why]
        idle = f"; {self.idle_closes} closed after {IDLE_CLOSE_S:.0f} s idle" if self.idle_closes else ""
        return line + idle + (f"; restarted after {', '.join(rebuilt)}" if rebuilt else "")

    def run(self, world_size: int, fn, *args, **kwargs) -> list:
        return self.get(world_size).run(fn, *args, **kwargs)

    def close_idle(self, idle_s: float = IDLE_CLOSE_S) -> None:
        """Close the pools no test has used for idle_s seconds (see IDLE_CLOSE_S); get() starts them again."""
        now = time.monotonic()
        for world_size, pool in list(self._pools.items()):
            if not pool.broken and now - pool.last_used > idle_s:
                pool.close()
                self.idle_closes += 1
                del self._pools[world_size]

    def close(self) -> None:
        for pool in self._pools.values():
            if not pool.broken:
                pool.close()
        self._pools.clear()


def compose_once(overrides=(), **kwargs):
    """minidist.cli.compose_config(overrides, **kwargs) in a body: rank 0 composes, the other ranks receive
    its configuration (or its error, so that every rank raises it and none waits in the broadcast).
    Hydra's compose costs ~90 ms of CPU: in the pool-heavy test files, half of ~430 composes repeated what
    another rank had just composed. Call it on every rank (a collective), as train() is."""
    import torch.distributed as dist

    from minidist.cli import compose_config
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return compose_config(overrides, **kwargs)
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = compose_config(overrides, **kwargs)
        except Exception as exc:  # noqa: BLE001 - sent to every rank and raised there
            box[0] = exc
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def run_command(cmd: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) for launchers (torchrun, shell scripts): in a
    session of its own, so that a run past `timeout` is killed with every process it started (killing
    torchrun alone leaves its workers running), and the test fails with the output it had so far."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise DistTestError(f"{' '.join(map(str, cmd))[:300]} did not finish within {timeout:.0f}s\n"
                            f"--- stdout:\n{out[-3000:]}\n--- stderr:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
