"""Gradient buckets: which parameters travel together, and the flat buffer they travel in.

Why buckets at all. An all_reduce of S bytes among N ranks costs about
``alpha * log N (or N) + 2 S (N-1)/N * beta``: a fixed latency alpha per call
plus a bandwidth term. One call per parameter pays alpha hundreds of times;
one call for the whole model cannot start until the *last* gradient exists, so
nothing overlaps with backward. Buckets of ``bucket_cap_mb`` are the middle
ground: few calls, and the first ones start while backward is still running.

Why reverse registration order. Backward visits layers roughly in the reverse
of the order in which they were registered (the output layer's gradient is
ready first), so packing parameters in reverse order makes bucket 0 complete
first, bucket 1 next, and so on.

Why a smaller first bucket. Bucket 0 is the only one whose all_reduce can start
before any other communication; the sooner it is complete, the sooner the wire
is busy. Like torch's ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) the first
bucket of each dtype is capped at ``min(1 MiB, bucket_cap)`` - as in torch,
only when ``bucket_cap_mb`` is left at its default: an explicit cap is the
user's choice for every bucket (see ReducerPolicy).

Why a small last bucket (not in torch). The last bucket to fill holds the
earliest layers; it is launched when backward has nothing left to compute, so
its whole all_reduce is exposed: ``2 (N-1) alpha + 2 s_L (N-1)/N * beta`` (``s_L``: its bytes; docs/ddp.md's ``c_L``) added to
every step. Every earlier bucket is launched while some layer still computes.
So the trailing parameters of each dtype go into a bucket of at most
``min(1 MiB, bucket_cap)`` (at least one parameter), and the bucket before it
closes early; the price is at most one more collective's alpha. With
``bucket_cap_mb=25`` on 8 Linear(1024, 1024) blocks after a Linear(64, 1024)
the exposed bucket shrinks from 4.3 MB (block 0 and the input layer) to the
input layer's 0.26 MB (benchmarks/ddp_vs_torch.py).

Lifecycle of one bucket in one iteration (explicit, asserted):

    FILLING --mark_ready x len(params)--> FULL --launch--> REDUCING --finish--> REDUCED --reset--> FILLING

FULL exists because buckets must be launched in the same order on every rank
(collectives on one process group are matched by issue order): a bucket that
fills before an earlier one waits in FULL until the earlier one has launched.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

MiB = 1024 * 1024
FIRST_BUCKET_BYTES = 1 * MiB
"""torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the cap of the first bucket."""


DEFAULT_BUCKET_CAP_MB = 25.0
"""torch's DDP default bucket_cap_mb."""


@dataclass(frozen=True)
class ReducerPolicy:
    """How gradients are bucketed and reduced (the knobs of torch's DDP, grouped; read by the Reducer)."""

    bucket_cap_mb: float | None = None
    """None: torch's default, 25 MiB buckets after a first one of 1 MiB."""
    find_unused_parameters: bool = False
    """Tolerate parameters without a gradient: one int32-per-parameter all_reduce per synced backward."""
    gradient_as_bucket_view: bool = False
    """p.grad becomes a view into its bucket: one gradient-sized buffer and one copy fewer."""

    def __post_init__(self):
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise ValueError(f"DDP: bucket_cap_mb={self.bucket_cap_mb} must be > 0, or None for torch's default "
                             f"(25 MiB buckets after a 1 MiB first one)")

    @property
    def bucket_cap_bytes(self) -> int:
        return max(1, int((DEFAULT_BUCKET_CAP_MB if self.bucket_cap_mb is None else self.bucket_cap_mb) * MiB))

    @property
    def first_bucket_bytes(self) -> int:
        """Small only by default, as in torch: an explicit bucket_cap_mb caps every bucket alike."""
        return min(FIRST_BUCKET_BYTES, self.bucket_cap_bytes) if self.bucket_cap_mb is None else self.bucket_cap_bytes

    @property
    def last_bucket_bytes(self) -> int:
        """Small whatever the cap: the last bucket's all_reduce is exposed (module docstring)."""
        return min(FIRST_BUCKET_BYTES, self.bucket_cap_bytes)


def assign_buckets(params: Sequence[nn.Parameter], bucket_cap_bytes: int,
                   first_bucket_bytes: int = FIRST_BUCKET_BYTES,
                   last_bucket_bytes: int | None = None) -> list[list[int]]:
    """Group ``params`` (given in expected-ready order) into buckets; return lists of indices.

    Rules (torch's ``compute_bucket_assignment_by_size``): one dtype and device
    per bucket; a bucket closes as soon as it *reaches* its cap, so it may exceed
    the cap by its last parameter; the first bucket of each (dtype, device) is
    capped at ``min(first_bucket_bytes, bucket_cap_bytes)``. Buckets come back
    sorted by the position of their first parameter, i.e. in the order they
    should fill. Not torch's: with ``last_bucket_bytes``, the last bucket of each
    (dtype, device) is the longest run of its trailing parameters that stays
    within it (at least one parameter); the bucket before closes where it begins.

    Why "reaches" and not "would exceed": closing *before* a large parameter
    leaves behind a bucket holding only what came before it (typically a lone
    bias of a few KiB), which pays a whole collective's latency alpha for
    nothing. With Linear layers, a cap below the weight size gives one bucket
    per layer (weight + bias) rather than two.
    """
    closed: list[list[int]] = []
    open_: dict[tuple, list[int]] = {}
    open_bytes: dict[tuple, int] = {}
    n_closed: dict[tuple, int] = {}
    tail = _last_bucket_starts(params, last_bucket_bytes) if last_bucket_bytes is not None else {}

    def close(key):
        closed.append(open_.pop(key))
        open_bytes[key] = 0
        n_closed[key] = n_closed.get(key, 0) + 1

    for i, p in enumerate(params):
        key = (p.dtype, p.device)
        in_tail = i >= tail.get(key, len(params))
        if i == tail.get(key) and open_.get(key):
            close(key)  # the last bucket starts here
        open_.setdefault(key, []).append(i)
        open_bytes[key] = open_bytes.get(key, 0) + p.numel() * p.element_size()
        cap = bucket_cap_bytes if n_closed.get(key, 0) else min(first_bucket_bytes, bucket_cap_bytes)
        if open_bytes[key] >= cap and not in_tail:
            close(key)
    closed.extend(b for b in open_.values() if b)
    return sorted(closed, key=lambda b: b[0])


def _last_bucket_starts(params: Sequence[nn.Parameter], cap: int) -> dict[tuple, int]:
    """For each (dtype, device): the index where its last bucket begins (trailing run within `cap`)."""
    starts: dict[tuple, int] = {}
    total: dict[tuple, int] = {}
    full: set[tuple] = set()
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.dtype, p.device)
        if key in full:
            continue
        nbytes = total.get(key, 0) + p.numel() * p.element_size()
        if key in starts and nbytes > cap:
            full.add(key)
            continue
        starts[key], total[key] = i, nbytes
    return starts


class BucketState(enum.Enum):
    FILLING = "filling"      # waiting for some of its gradients
    FULL = "full"            # every gradient is in; waiting for earlier buckets to launch
    REDUCING = "reducing"    # its collective (the comm hook's future) is in flight
    REDUCED = "reduced"      # the future's result is in `flat` (in place: in `grads`)


class Bucket:
    """One flat gradient buffer and the parameters whose gradients live in it.

    Layout: ``flat`` is 1-D, ``sum(p.numel())`` elements of one dtype/device;
    parameter j occupies ``flat[offsets[j] : offsets[j] + p.numel()]`` and
    ``views[j]`` is that slice shaped like the parameter (a view, no copy).
    ``flat`` is allocated on first use: a bucket reduced in place (below) may
    never need it, which saves one gradient-sized buffer.

    In place (``in_place``, set by the reducer): this iteration's reduction works
    on ``grads[j]``, the parameters' own gradient tensors, instead of copies in
    ``flat`` (reduction.py: why).

    The method names ``buffer() / index() / parameters() / gradients() /
    is_last()`` mirror torch's ``GradBucket`` so that communication hooks read
    the same as torch's.
    """

    def __init__(self, index: int, params: list[nn.Parameter], param_ids: list[int], is_last: bool,
                 dtype: torch.dtype | None = None):
        self._index = index
        self.dtype = dtype or params[0].dtype
        """The flat buffer's dtype: the parameters' own, or a mixed-precision reduce_dtype."""
        self.params = params
        self.param_ids = param_ids
        """Position of each parameter in the reducer's parameter list."""
        self._is_last = is_last
        p0 = params[0]
        assert all(p.dtype == p0.dtype and p.device == p0.device for p in params), "one dtype/device per bucket"
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:j]) for j in range(len(params))]
        self._flat: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self.in_place = False
        self.grads: list[torch.Tensor | None] = [None] * len(params)
        """In place: the tensor that holds parameter j's gradient this iteration, once it is ready."""
        self.state = BucketState.FILLING
        self.pending = len(params)
        """Gradients still missing this iteration; the bucket is FULL at 0."""
        self.future: torch.futures.Future | None = None

    @property
    def flat(self) -> torch.Tensor:
        if self._flat is None:
            p0 = self.params[0]
            self._flat = torch.zeros(sum(self.numels), dtype=self.dtype, device=p0.device)
            self._views = [self._flat[o:o + n].view_as(p)
                           for o, n, p in zip(self.offsets, self.numels, self.params)]
        return self._flat

    @property
    def views(self) -> list[torch.Tensor]:
        self.flat  # noqa: B018 - allocates on first use
        return self._views

    # torch GradBucket-style accessors, for comm hooks
    def buffer(self) -> torch.Tensor:
        return self.flat

    def index(self) -> int:
        return self._index

    def parameters(self) -> list[nn.Parameter]:
        return self.params

    def gradients(self) -> list[torch.Tensor]:
        return self.views

    def is_last(self) -> bool:
        return self._is_last

    # transitions
    def mark_ready(self) -> bool:
        """One more gradient is in its view; True when that was the last one."""
        assert self.state is BucketState.FILLING, f"bucket {self._index}: mark_ready while {self.state.name}"
        assert self.pending > 0
        self.pending -= 1
        if self.pending == 0:
            self.state = BucketState.FULL
            return True
        return False

    def launch(self, future: torch.futures.Future) -> None:
        assert self.state is BucketState.FULL, f"bucket {self._index}: launch while {self.state.name}"
        self.future = future
        self.state = BucketState.REDUCING

    def finish(self) -> None:
        """Wait for the reduction and leave its result in ``flat`` (in place: it already is in ``grads``)."""
        assert self.state is BucketState.REDUCING, f"bucket {self._index}: finish while {self.state.name}"
        result = self.future.wait()
        if not self.in_place:  # in place, the reduction already left the answers in grads
            if isinstance(result, list):  # a raw Work future yields [tensor]
                result = result[0]
            if result.data_ptr() != self.flat.data_ptr():
                self.flat.copy_(result.view_as(self.flat))
        self.future = None  # drop the Work: nothing stays referenced after backward
        self.state = BucketState.REDUCED

    def abandon(self) -> None:
        """Error path: wait out any in-flight work, then forget this iteration."""
        if self.state is BucketState.REDUCING:
            try:
                self.future.wait()
            except Exception:  # noqa: BLE001 - the error being raised already says what failed
                pass
        self.future = None
        self.state = BucketState.REDUCED

    def reset(self) -> None:
        assert self.state is BucketState.REDUCED, f"bucket {self._index}: reset while {self.state.name}"
        self.pending = len(self.params)
        self.grads = [None] * len(self.params)
        self.state = BucketState.FILLING
