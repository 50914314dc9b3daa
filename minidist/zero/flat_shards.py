"""ZeRO as the paper wrote it: equal flat shards, reduce_scatter, step on the shard, all_gather.

One step, per rank (Rajbhandari et al. 2020, P_os = ZeRO-1 and P_os+g = ZeRO-2):

    backward   each bucket's gradient is reduce_scattered as soon as it is full  reduce_scatter.py
               (S (N-1)/N bytes): this rank receives the average of its shard
    step()     the wrapped optimizer updates this rank's shards only              sharded_optimizer.py
               (its state: K psi / N bytes)
    after      one all_gather per bucket writes every shard into every rank's     all_gather.py
               parameters (S (N-1)/N bytes)

Bytes per rank and step: 2 S (N-1)/N, exactly DDP's all_reduce (an all_reduce *is*
a reduce_scatter followed by an all_gather; ZeRO runs the optimizer in between, on
1/N of the elements). Memory per rank, fp32 with AdamW (K = 8: two moments):

    ZeRO-1   4 psi parameters + 4 psi gradients (one flat buffer) + 8 psi / N
    ZeRO-2   4 psi parameters + 4 psi / N gradients (+ the buckets in flight) + 8 psi / N

and under a MixedPrecisionPolicy(param_dtype=bf16) the paper's (2 + 2 + 12 / N) psi:
2-byte parameters and gradients, 1/N of the fp32 master weights and Adam's moments; plus,
which the paper does not count, the fp32 gradient of this rank's shard that the optimizer
steps on (4 psi / N; ZeRO-2 keeps only that one, not the 2-byte buffers). Measured against
MemTracker in recipes/worked_numbers.py.

The parameters are grouped into buckets (the rules DDP's buckets follow too:
minidist.buckets.policy.assign_buckets, in reverse registration order, one parameter group,
dtype and device per bucket), each bucket laid out flat and split in N equal shards
(bucket_shards.py, bucket.py).

Limits of flat shards: the wrapped optimizer sees 1-D shards that cut across
parameters, so it must be elementwise (SGD, Adam, AdamW, Adagrad, RMSprop, ...:
every torch.optim optimizer but LBFGS and Adafactor's factored second moment); a
parameter that got no gradient in a step is stepped with a zero gradient (weight
decay and momentum still apply; in one process torch skips it). The owner-broadcast
variant (owner_broadcast.py) has neither limit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist.buckets.policy import ReducerPolicy, assign_buckets
from minidist.precision import MixedPrecisionPolicy, cast_floating
from minidist.zero.all_gather import ParamGather
from minidist.zero.bucket import ZeroBucket
from minidist.zero.bucket_shards import BucketShards, Piece
from minidist.zero.reduce_scatter import GradientReducer


MAX_INFLIGHT_REDUCTIONS = 2
"""ZeRO-2: buckets whose gradient may be reduce_scattering at once (DeepSpeed double-buffers its bucket)."""


class FlatShards:
    """The paper's engine behind ShardedOptimizer (stage 1 or 2)."""

    def __init__(self, group: dist.ProcessGroup | None, stage: int, bucket_cap_mb: float | None,
                 mp_policy: MixedPrecisionPolicy | None, overlap_param_gather: bool):
        self.group, self.stage = group, stage
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.caps = ReducerPolicy(bucket_cap_mb)
        self.mp = mp_policy or MixedPrecisionPolicy()
        self.buckets: list[ZeroBucket] = []
        self.gather = ParamGather(overlap_param_gather)
        self.reducer = GradientReducer(self.gather.wait_all, max_inflight=MAX_INFLIGHT_REDUCTIONS if stage == 2 else None)
        self._bucket_of: dict[int, ZeroBucket] = {}
        self._module: nn.Module | None = None
        self._cast_handle = None

    # ------------------------------------------------------------------ building
    def add_params(self, params: list[nn.Parameter], first_index: int, names: list[str]) -> list[torch.Tensor]:
        """Bucket, flatten and shard `params` (one parameter group); return this rank's shards."""
        order = list(reversed(range(len(params))))  # backward produces the last layers' gradients first
        groups = assign_buckets([params[i] for i in order], self.caps.bucket_cap_bytes,
                                self.caps.first_bucket_bytes, self.caps.last_bucket_bytes)
        new = []
        for members in groups:
            ids = [order[k] for k in members]
            ps = [params[i] for i in ids]
            shards = BucketShards(tuple(first_index + i for i in ids), tuple(p.numel() for p in ps), self.world)
            param_dtype = self.mp.param_dtype or ps[0].dtype
            bucket = ZeroBucket(len(self.buckets), shards, ps, self.rank, self.group, param_dtype,
                                self.mp.reduce_dtype_for(ps[0].dtype), keep_grads=self.stage == 1)
            self.buckets.append(bucket)
            self.reducer.add(bucket, [names[i] for i in ids])
            self._bucket_of.update((id(p), bucket) for p in ps)
            new.append(bucket)
        if self._module is not None:
            self.attach(self._module)  # hook the new parameters' modules too
        return [b.master for b in new]

    def attach(self, module: nn.Module) -> None:
        """Forward pre-hooks on `module`: wait for gathered parameters (overlap), cast inputs (param_dtype)."""
        self._module = module
        self.gather.remove_hooks()
        if self.gather.overlap:
            self.gather.attach(module, self._bucket_of)
        if self.mp.param_dtype is not None and self._cast_handle is None:
            dtype = self.mp.param_dtype
            self._cast_handle = module.register_forward_pre_hook(
                lambda _m, args, kwargs: (cast_floating(args, dtype), cast_floating(kwargs, dtype)), with_kwargs=True)

    # ------------------------------------------------------------------ the step
    @property
    def require_backward_grad_sync(self) -> bool:
        return self.reducer.require_backward_grad_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self.reducer.require_backward_grad_sync = value

    def accumulated_grad(self, p: nn.Parameter) -> torch.Tensor:
        bucket = self._bucket_of[id(p)]
        return bucket.accumulated(next(j for j, q in enumerate(bucket.params) if q is p))

    def reduce_accumulated(self) -> None:
        self.reducer.reduce_accumulated()

    def before_step(self) -> None:
        self.gather.wait_all()  # the previous step's gathers (overlap): the shards are written again now

    def after_step(self) -> None:
        self.gather.launch(self.buckets)

    def wait_for_params(self) -> None:
        """Make the model's parameters current (a checkpoint or an evaluation outside forward reads them)."""
        self.gather.wait_all()

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.zero_grad()
            for p in bucket.params:
                p.grad = None

    def grad_pieces(self) -> tuple[list[tuple[int, torch.Tensor]], bool]:
        """(parameter position, a view of its piece of this rank's averaged gradient) per piece; True: shards."""
        return [(piece.param, b.master.grad[piece.shard_start:piece.shard_start + piece.numel])
                for b in self.buckets if b.master.grad is not None for piece in b.shards.pieces(self.rank)], True

    # ------------------------------------------------------------------ checkpoints
    def local_pieces(self) -> list[list[Piece]]:
        """For each shard the inner optimizer steps (in its order): the parameter pieces it holds."""
        return [b.shards.pieces(self.rank) for b in self.buckets]

    @property
    def separate_masters(self) -> bool:
        return any(not b.master_is_param for b in self.buckets)

    def refresh_masters(self) -> None:
        for b in self.buckets:
            b.refresh_master()

    def signature(self) -> list:
        return [(b.shards.param_ids, b.shards.numels) for b in self.buckets]

    def buffer_numels(self) -> list[int]:
        """Elements per bucket (padded): what each reduce_scatter and all_gather moves."""
        return [b.shards.padded_numel for b in self.buckets]
