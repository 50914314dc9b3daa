"""What the checker measures with, none of it minidist's: torch's profiler, torch's MemTracker, the kernel.

    with Profiled() as p:
        with p.window("step"):
            step()
    p.count("c10d::allreduce", "step")   # collectives torch's dispatcher ran inside the window
    with Memory(model, opt) as m:
        step()
    m.extra, m.kept                      # peak live bytes above the start; bytes left alive at the end

Collectives are counted from the profiler's operator events (c10d::allreduce_, c10d::broadcast_,
...): every torch.distributed call goes through the dispatcher, whether the learner called it
through minidist.comm or directly; their order against the model's emulated compute is read from
the same profile (record_function windows). Bytes on the wire are what the kernel saw this process
write (minidist.comm.kernel_io, /proc/self/io), a bare barrier pair subtracted.

Memory: torch's MemTracker (torch.distributed._tools.mem_tracker), a dispatch mode that sees
every tensor storage an operator creates or resizes and, through a weak reference, its release on
whatever thread it happens. The profiler's allocator events (profile_memory) would be the other
torch instrument, but it follows the thread that started it only: a block a collective's work
object releases on gloo's worker thread (an all_gather's output, a reduce_scatter's input) is never
seen freed (seen here: 27 KiB of ZeRO-1's all_gather output kept on one rank of two, and every
FSDP gradient handed to a reduce_scatter). MemTracker also follows modules, and refuses a module
called again at the top of one block (a pipeline stage runs once per micro-batch): `Storages` is
its mechanism without the module tracking, torch's dispatcher reporting every storage an
operator returns, and a weak reference to that storage its release.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import threading
import time
import warnings
import weakref
from typing import Callable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minidist.comm import kernel_io


def over_ranks(value: float, op=dist.ReduceOp.MAX) -> float:
    """`value` reduced over every rank (MAX, MIN or SUM): every rank gets the same number, and so the same verdict."""
    t = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(t, op)
    return float(t)


def largest_difference(pairs: dict[str, tuple]) -> tuple[str, float]:
    """(which, how much) of the named (got, want) tensor pairs differs most, over every rank (inf: a
    missing tensor or a wrong shape)."""
    errs = {k: float("inf") if a is None or a.shape != b.shape else (a - b).abs().max().item()
            for k, (a, b) in pairs.items()}
    worst = max(errs, key=errs.get)
    return worst, over_ranks(errs[worst])


def kernel_bytes(fn: Callable[[], object]) -> tuple[float, float]:
    """(mean, largest) over the ranks of the bytes each process wrote while fn() ran, as the kernel counts them."""
    with kernel_io.written() as w:
        fn()
    return over_ranks(w.bytes, dist.ReduceOp.SUM) / dist.get_world_size(), over_ranks(w.bytes)


class Profiled:
    """torch.profiler (CPU) around a block: every operator it ran, and named windows (record_function)."""

    def __init__(self):
        self.ops: list[tuple[int, int, str]] = []       # (start ns, end ns, name) of every operator and range
        self._prof = None

    def __enter__(self) -> "Profiled":
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto's own log lines, on a CUDA build without a GPU
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        stack = list(self._prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            e = stack.pop()
            stack.extend(e.children)
            self.ops.append((e.start_time_ns, e.end_time_ns, e.name))
        self.ops.sort()

    @staticmethod
    def window(name: str):
        """A named range of the profile (torch.profiler.record_function)."""
        from torch.profiler import record_function
        return record_function(f"check:{name}")

    def span(self, name: str, k: int = 0) -> tuple[int, int]:
        """(start, end) ns of the k-th window called `name`."""
        spans = [(a, b) for a, b, n in self.ops if n == f"check:{name}"]
        if len(spans) <= k:
            raise RuntimeError(f"the checker's window {name!r} was not recorded")
        return spans[k]

    def starts(self, op_prefix: str, window: str | None = None) -> list[int]:
        """Start times of the operators whose name begins with `op_prefix` (inside `window`)."""
        lo, hi = self.span(window) if window else (0, 1 << 63)
        return [a for a, _, n in self.ops if n.startswith(op_prefix) and lo <= a <= hi]

    def count(self, op_prefix: str, window: str | None = None) -> int:
        return len(self.starts(op_prefix, window))


class Memory:
    """Live tensor bytes inside a block (torch's MemTracker), relative to what `external` held when it opened.

    `external`: modules and optimizers whose parameters, gradients and state exist already; they
    are counted from the start, so that touching them inside the block adds nothing. Anything else
    created inside is counted while it lives.
    A collective on every rank: a barrier ends the block.
    """

    def __init__(self, *external):
        self.external = external
        self.start = self.end = self.peak = 0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Memory":
        from torch.distributed._tools.mem_tracker import MemTracker
        self._mt = MemTracker()
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", UserWarning)  # MemTracker warns about the None grads it is handed
        self._mt.track_external(*self.external)
        self._stack.enter_context(self._mt)
        self.start = self._total("current")
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None and dist.is_initialized():
            dist.barrier()  # gloo's worker drops a finished collective's tensors just after the caller resumes
        gc.collect(1)   # the block's young cyclic garbage is not kept memory (a full collection costs 0.1 s)
        self.peak = self._total("peak")
        self.end = self._settled()
        self._stack.close()

    def _settled(self, seconds: float = 0.1) -> int:
        """Live bytes once gloo's worker thread has let go of the block's collectives' tensors: the least seen over
        a short wait. That release lands a moment after the barrier returns, later on a loaded machine (seen under
        the whole suite: a tp forward's all_reduce buffer, 64 KiB, still counted); nothing else runs meanwhile."""
        least, deadline = self._total("current"), time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)
            least = min(least, self._total("current"))
        return least

    def _total(self, kind: str) -> int:
        return int(self._mt.get_tracker_snapshot(kind).get(torch.device("cpu"), {}).get("Total", 0))

    @property
    def extra(self) -> int:
        """Peak live bytes inside the block, above the start."""
        return self.peak - self.start

    @property
    def kept(self) -> int:
        """Bytes the block left alive."""
        return self.end - self.start


class Storages(TorchDispatchMode):
    """Live bytes of the tensor storages operators create inside the block: `peak` and `kept` (at its end).

    MemTracker's mechanism without its module tracking: every tensor an operator returns on a storage
    none of its inputs had adds that storage's bytes; a weak reference to the storage subtracts them when
    it is released, on whatever thread (a collective's buffer, dropped by gloo's worker). Tensors
    that existed before the block are not counted, nor are in-place updates of them.
    """

    def __enter__(self) -> "Storages":
        self.live = self.peak = self.kept = 0
        self._refs: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if exc[0] is None and dist.is_initialized():
            dist.barrier()  # gloo's worker drops a finished collective's tensors just after the caller resumes
        gc.collect(1)
        self.kept = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                with self._lock:
                    if id(st) not in self._refs and id(st) not in inputs:   # a view or an in-place result: not new
                        self._refs[id(st)] = weakref.ref(st, functools.partial(self._free, id(st), st.nbytes()))
                        self.live += st.nbytes()
                        self.peak = max(self.peak, self.live)
        return out

    def _free(self, key: int, nbytes: int, _ref) -> None:
        with self._lock:
            self._refs.pop(key, None)
            self.live -= nbytes
