"""One all_reduce bucket: the flat buffer its gradients travel in, and its lifecycle.

Which parameters share a bucket is policy.py's (assign_buckets); how a full bucket is
reduced, in place or through this flat buffer, is reduction.py's; when it is launched
is the launcher's (launcher.py: strictly in bucket order).

Lifecycle of one bucket in one iteration (explicit, asserted):

    FILLING --mark_ready x len(params)--> FULL --launch--> REDUCING --finish--> REDUCED --reset--> FILLING

FULL exists because buckets must be launched in the same order on every rank
(collectives on one process group are matched by issue order): a bucket that
fills before an earlier one waits in FULL until the earlier one has launched.
"""

from __future__ import annotations

import enum

import torch
import torch.nn as nn


class BucketState(enum.Enum):
    FILLING = "filling"      # waiting for some of its gradients
    FULL = "full"            # every gradient is in; waiting for earlier buckets to launch
    REDUCING = "reducing"    # its collective (the comm hook's future) is in flight
    REDUCED = "reduced"      # the future's result is in `flat` (in place: in `grads`)


class Bucket:
    """One flat gradient buffer and the parameters whose gradients live in it.

    Its buffer: ``flat`` is 1-D, ``sum(p.numel())`` elements of one dtype/device;
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
