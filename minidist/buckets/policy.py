"""Which gradients travel together: the bucket policy and the assignment, shared by DDP and ZeRO.

Why buckets at all. A collective of S bytes among N ranks costs about
``alpha * (N-1) + S * f * beta`` (alpha: a fixed latency per call, beta: seconds per
byte; f = 2 (N-1)/N for DDP's all_reduce, (N-1)/N for ZeRO's reduce_scatter). One call per
parameter pays alpha hundreds of times; one call for the whole model cannot start until
the *last* gradient exists, so nothing overlaps with backward. Buckets of
``bucket_cap_mb`` are the middle ground: few calls, and the first ones start while
backward is still running.

Why reverse registration order. Backward visits layers roughly in the reverse of the
order in which they were registered (the output layer's gradient is ready first), so
packing parameters in reverse order makes bucket 0 complete first, bucket 1 next, and
so on; the launcher (launcher.py) starts them in that order.

Why a smaller first bucket. Bucket 0 is the only one whose collective can start before
any other communication: until it is full the wire idles while backward computes. Its
fill time is that of the layers it covers, so a bucket of s_0 bytes puts the first byte
on the wire after the backward of those s_0 bytes' layers, and its own transfer,
``alpha (N-1) + s_0 f beta``, is what the next bucket's launch may queue behind. Like
torch's ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) the first bucket of each dtype is
capped at ``min(1 MiB, bucket_cap)`` - as in torch, only when ``bucket_cap_mb`` is left
at its default: an explicit cap is the user's choice for every bucket.

Why a small last bucket (not in torch). The last bucket to fill holds the earliest
layers; it is launched when backward has nothing left to compute, so its whole
collective is exposed: ``alpha (N-1) + s_L f beta`` (``s_L``: its bytes; docs/ddp.md's
``c_L``) added to every step. Every earlier bucket is launched while some layer still
computes. So the trailing parameters of each dtype go into a bucket of at most
``min(1 MiB, bucket_cap)`` (at least one parameter), and the bucket before it closes
early; the price is at most one more collective's alpha. With ``bucket_cap_mb=25`` on 8
Linear(1024, 1024) blocks after a Linear(64, 1024) the exposed bucket shrinks from
4.3 MB (block 0 and the input layer) to the input layer's 0.26 MB
(benchmarks/ddp_vs_torch.py).

Pure arithmetic on sizes: no process group, no tensor allocated; every rank computes the
same buckets from the same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch.nn as nn

MiB = 1024 * 1024
FIRST_BUCKET_BYTES = 1 * MiB
"""torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the cap of the first bucket."""


DEFAULT_BUCKET_CAP_MB = 25.0
"""torch's DDP default bucket_cap_mb."""


@dataclass(frozen=True)
class ReducerPolicy:
    """How gradients are bucketed and reduced (the knobs of torch's DDP, grouped).

    DDP's reducer reads all three; ZeRO's buckets read the caps only (bucket_cap_mb is
    ShardedOptimizer's argument too)."""

    bucket_cap_mb: float | None = None
    """None: torch's default, 25 MiB buckets after a first one of 1 MiB."""
    find_unused_parameters: bool = False
    """Tolerate parameters without a gradient: one int32-per-parameter all_reduce per synced backward."""
    gradient_as_bucket_view: bool = False
    """p.grad becomes a view into its bucket: one gradient-sized buffer and one copy fewer."""

    def __post_init__(self):
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb={self.bucket_cap_mb} must be > 0, or None for torch's default "
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
