"""Per-rank peak memory of one training step, measured as live tensor bytes and split by role.

    ledger = MemoryLedger(roles_of(model, optimizer))
    with ledger:
        step()
    ledger.peak.total, ledger.peak.by_role        # bytes at the step's peak, and what they were

The allocator's own count (minidist.compare.allocator: torch's profiler on the CPU, the CUDA
allocator's statistics) is the instrument the totals are checked against; the ledger says what
the bytes *are*. What a strategy changes is which tensors exist, so that is what is counted:

  * every storage an operator creates is seen by a TorchDispatchMode (forward, backward and
    optimizer run on this thread), and its bytes are added while it lives (a weak reference
    to the storage says when it is freed); collectives are dispatcher ops too (c10d::*),
    so the buffers they are handed are seen, and tagged "communication buffer";
  * UntypedStorage.resize_ is not an operator: it is wrapped while the ledger is active,
    because FSDP allocates and frees its unsharded parameters exactly so;
  * storages that exist before the step (parameters, optimizer state, engine buffers) are
    registered up front, read from the engines' own live() (minidist.footprint) without
    allocating anything;
  * tensors autograd saves for backward are seen by saved_tensors_hooks: those are the
    activations.

At every change that raises the total, the live storages are classified, first match wins:

    buffers      FSDP's unsharded parameters (`full`), gathers and reduce inputs in flight, DDP's
                 and ZeRO's gradient buckets, anything handed to a collective (the owner-broadcast
                 variant's broadcasts)
    parameters   storages of model.parameters() (FSDP: this rank's shards)
    gradients    .grad of any parameter (FSDP: sharded and unsharded) and FSDP's reduce output
    optimizer    tensors in optimizer.state (ZeRO: this rank's partitions), ZeRO's fp32 masters
    activations  saved for backward
    other        everything else alive: gradients of activations during backward, an
                 operator's scratch, the batch

Counted once per storage: a view (an FSDP parameter inside `full`, a weight saved by a
matmul) adds nothing. A backend's own allocations are seen only once Python-visible operators
touch them: gloo's reduce_scatter clones its input for an all_reduce, and the clone appears
(as "other") when the wait slices it. Cost: Python work per operator, so the ledger runs on a separate,
untimed step.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minidist.footprint import ROLES  # noqa: E402 - the columns of a breakdown

RoleSource = Callable[[], dict[str, Iterable[torch.Tensor]]]
"""Returns, when called, the tensors that currently play each role (see roles_of)."""


def storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's storage (views share it); stable while the storage lives."""
    return t.untyped_storage()._cdata


@dataclass
class Snapshot:
    """Bytes alive at one instant, by role."""

    total: int = 0
    by_role: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    where: str = ""
    """The phase the ledger was in (forward, backward, optimizer), if the caller set it."""
    time: float = 0.0
    """perf_counter() when it was taken."""


class MemoryLedger(TorchDispatchMode):
    """Live tensor bytes of this thread's work, and their breakdown at the peak (see module docstring)."""

    def __init__(self, roles: RoleSource, observer: Callable[["MemoryLedger"], None] | None = None):
        super().__init__()
        self._roles = roles
        self._observer = observer
        """Called after every operator (minidist.compare.estimate samples the whole step so)."""
        self.tag = None
        """Set by the caller (e.g. the module running now); saved tensors remember it."""
        self.unpacked_tag = None
        """The tag of the saved tensor backward used last: which module backward is in."""
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self._comm: set[int] = set()
        self._saved: dict[int, int] = {}  # storage key -> tensors saved for backward on it
        self._lock = threading.RLock()
        self.total = 0
        self.peak = Snapshot()
        self.phase = ""
        self._orig_resize = None
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    # -- bookkeeping ----------------------------------------------------------------------------
    def _track(self, st: torch.UntypedStorage) -> None:
        key, n = st._cdata, st.nbytes()
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                self._live[key] = (weakref.ref(st, lambda _r, k=key: self._forget(k)), n)
                self.total += n
            elif entry[1] != n:
                self._live[key] = (entry[0], n)
                self.total += n - entry[1]

    def _forget(self, key: int) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                self.total -= entry[1]
            self._comm.discard(key)

    def _track_tensors(self, tensors: Iterable) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t.untyped_storage())

    def _note_peak(self) -> None:
        if self.total > self.peak.total:
            self.peak = self.classify()
        if self._observer is not None:
            self._observer(self)

    # -- what each live storage is --------------------------------------------------------------
    def classify(self) -> Snapshot:
        """The live bytes now, by role."""
        owners: dict[int, str] = {}
        for role, tensors in self._roles().items():
            for t in tensors:
                if t is not None:
                    owners.setdefault(storage_key(t), role)
        for key in self._comm:
            owners.setdefault(key, "buffers")
        for key in self._saved:
            owners.setdefault(key, "activations")
        snap = Snapshot(where=self.phase, time=time.perf_counter())
        with self._lock:
            for key, (_ref, n) in self._live.items():
                snap.by_role[owners.get(key, "other")] += n
                snap.total += n
        return snap

    # -- hooks ----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "c10d":
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    self._comm.add(storage_key(t))
        self._track_tensors(tree_leaves(out))
        self._note_peak()
        return out

    def _pack(self, t: torch.Tensor) -> "_Saved":
        return _Saved(t, self)

    def _unpack(self, saved: "_Saved") -> torch.Tensor:
        self.unpacked_tag = saved.tag
        return saved.tensor

    def _resize(self, st: torch.UntypedStorage, size: int):
        out = self._orig_resize(st, size)
        self._track(st)
        self._note_peak()
        return out

    def __enter__(self):
        self._track_tensors(t for ts in self._roles().values() for t in ts if t is not None)
        self.peak = self.classify()
        self._orig_resize = torch.UntypedStorage.resize_
        ledger = self
        torch.UntypedStorage.resize_ = lambda st, size: ledger._resize(st, size)
        self._saved_hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._saved_hooks.__exit__(*exc)
            torch.UntypedStorage.resize_ = self._orig_resize


class _Saved:
    """A tensor autograd keeps for backward; counted as an activation until autograd drops it."""

    __slots__ = ("tensor", "tag", "_key", "_ledger")

    def __init__(self, tensor: torch.Tensor, ledger: MemoryLedger):
        self.tensor, self.tag, self._ledger = tensor, ledger.tag, ledger
        self._key = storage_key(tensor)
        with ledger._lock:
            ledger._saved[self._key] = ledger._saved.get(self._key, 0) + 1
        ledger._track(tensor.untyped_storage())

    def __del__(self):
        ledger = self._ledger
        with ledger._lock:
            left = ledger._saved.get(self._key, 0) - 1
            if left > 0:
                ledger._saved[self._key] = left
            else:
                ledger._saved.pop(self._key, None)


def roles_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> RoleSource:
    """The tensors playing each role *now*, for a model and optimizer as the trainer builds them.

    Engine tensors come from each engine's own live() (minidist.footprint): DDP's flat buffers
    only where they exist, FSDP's unsharded buffers, gathers and reductions in flight, ZeRO's
    flat parameters, gradient buffers and shards. Reading them allocates nothing (a DDP
    bucket's `flat` property would). comm's flight recorder and trace keep no tensor: nothing
    of theirs to name.
    """
    from minidist.ddp import footprint as ddp_footprint
    from minidist.fsdp import footprint as fsdp_footprint
    from minidist.zero import footprint as zero_footprint

    def roles() -> dict[str, list[torch.Tensor]]:
        params = list(model.parameters())
        out = {"parameters": params, "gradients": [p.grad for p in params], "buffers": [], "optimizer": [],
               "other": []}
        for live in (ddp_footprint.live(model), fsdp_footprint.live(model), zero_footprint.live(optimizer)):
            for role, tensors in live.items():
                out[role] += tensors
        out["optimizer"] += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return {"buffers": out["buffers"], "parameters": out["parameters"], "gradients": out["gradients"],
                "optimizer": out["optimizer"], "other": out["other"]}
    return roles

