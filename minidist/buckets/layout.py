"""Where each gradient sits while it is reduced: the buckets in launch order, and each parameter's slot.

assign_buckets (policy.py) says which gradients travel together, for parameters taken
in a given order; ``build`` turns its groups into Buckets (bucket.py), numbered in
that order (the order the launcher starts them in), and keeps the map back from a
parameter to its place: parameter i lives in ``buckets[b].views[j]`` for
``(b, j) = slot[i]``. The reducer builds a layout twice at most: at construction, in
reverse registration order (roughly the order backward produces gradients), and once
after its first synced backward, in the order that backward really produced them
(ready_order.py). With gradient_as_bucket_view a gradient that already exists moves
into its new slot (``move_grads``), so ``p.grad`` is a view of the bucket from then on.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.buckets.bucket import Bucket
from minidist.buckets.policy import ReducerPolicy, assign_buckets

Slot = tuple[int, int]
"""(bucket index, position in the bucket) of one parameter."""


def build(params: list[nn.Parameter], order: list[int], policy: ReducerPolicy,
          dtype: torch.dtype | None) -> tuple[list[Bucket], list[Slot]]:
    """The buckets for `params` taken in `order` (indices into params), and each parameter's slot.

    `dtype`: the buckets' dtype when it differs from the gradients' (mixed precision's
    reduce_dtype), else None.
    """
    groups = assign_buckets([params[i] for i in order], policy.bucket_cap_bytes,
                            policy.first_bucket_bytes, policy.last_bucket_bytes)
    buckets: list[Bucket] = []
    slot: list[Slot] = [(-1, -1)] * len(params)
    for b, members in enumerate(groups):
        ids = [order[k] for k in members]
        buckets.append(Bucket(b, [params[i] for i in ids], ids, is_last=b == len(groups) - 1, dtype=dtype))
        for j, i in enumerate(ids):
            slot[i] = (b, j)
    return buckets, slot


def move_grads(params: list[nn.Parameter], buckets: list[Bucket], slot: list[Slot]) -> None:
    """gradient_as_bucket_view: every existing ``p.grad`` is copied into its slot and becomes that view."""
    for i, p in enumerate(params):
        if p.grad is not None:
            b, j = slot[i]
            view = buckets[b].views[j]
            view.copy_(p.grad)
            p.grad = view
