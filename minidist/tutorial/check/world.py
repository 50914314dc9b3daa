"""A world of N gloo processes for the checker, started by itself and bounded in time.

    results = run_world(run_checks, ("ddp_naive", "mine.py"), world=2, timeout_s=120)
    results[rank] -> ("ok", value) | ("error", one line) | ("missing", why)

Started by a forkserver that imported torch once (a clean interpreter, not a fork of the caller's,
which may hold threads; each rank a fork of it: one import of torch, ~2 s of CPU, instead of one per
rank), joined through a file store in a temporary directory. Each rank's process group times out after `collective_s` (a
collective the other ranks never make raises instead of waiting for ever), and the whole world
is killed at `timeout_s`: the checker always answers.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import time
from typing import Callable


def _rank_main(rank: int, world: int, store: str, collective_s: float, fn: Callable, args: tuple, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_s))
        try:
            results.put((rank, ("ok", fn(*args))))
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        results.put((rank, ("error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}")))


def run_world(fn: Callable, args: tuple, world: int, timeout_s: float, collective_s: float = 30.0) -> list[tuple]:
    """fn(*args) on every rank of a fresh gloo world of `world` processes; one outcome per rank."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # inherited by the ranks: Kineto stays quiet
    ctx = mp.get_context("forkserver")
    # imported once, by the forkserver, not by each rank: torch (~1.5 s of CPU) and torch._dynamo (~1.3 s, which
    # torch.optim imports at its first step)
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="minidist-check-") as tmp:
        procs = [ctx.Process(target=_rank_main, args=(r, world, os.path.join(tmp, "store"), collective_s, fn, args,
                                                      results), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        got: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, outcome = results.get(timeout=0.2)
                got[rank] = outcome
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
        for p in procs:
            p.join(timeout=5 if len(got) == world else 0)
            if p.is_alive():
                p.kill()
                p.join()
    why = f"did not finish within {timeout_s:.0f} s" if time.monotonic() >= deadline else "died without a word"
    return [got.get(r, ("missing", f"rank {r} {why}")) for r in range(world)]
