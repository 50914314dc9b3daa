"""ShardedOptimizer: ZeRO, any elementwise torch optimizer with its state split across ranks.

    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, mesh=mesh, lr=1e-3)   # ZeRO-1
    loss.backward()          # each bucket's gradient is reduce_scattered as it fills
    opt.step()               # this rank's shards only, then one all_gather per bucket
    opt.zero_grad()

The model needs no wrapper: the optimizer hooks the parameters' gradients itself
(CS336's shape). It must not be wrapped in minidist.DDP (whose all_reduce would send
the gradients a second time). On construction every rank checks that it was given
the same parameters and takes rank 0's values, as DDP does.

    stage=1 (ZeRO-1, P_os)      optimizer state sharded; the full gradient buffer stays
    stage=2 (ZeRO-2, P_os+g)    + each bucket's gradient freed once reduce_scattered: psi / N
    owner_broadcast=True        torch's ZeroRedundancyOptimizer design (owner_broadcast.py)

flat_shards.py has the algorithm and its costs, bucket_shards.py who owns which
elements, bucket.py the buffers, reduce_scatter.py the backward, all_gather.py the return of
the parameters, state_dict.py the checkpoints.

After a synced backward ``p.grad`` is None for every parameter: the gradient lives in
the buckets, and this rank's averaged shard in the tensors the wrapped optimizer
steps (``param_groups`` holds those shards; schedulers, ``torch.amp`` scalers and
zero_grad see them). Hence ``clip_grad_norm_`` here, which sums the shards'
squared norms over the ranks (minidist.clip); with fp16, torch's ShardedGradScaler makes every rank
agree on skipping a step.

``no_sync()``: backwards inside accumulate locally (into the buckets) and the next
synced backward reduces the sum. The flag is read when a backward starts, so the
backward must run inside the block (minidist.DDP reads it in the forward).

Why subclass torch.optim.Optimizer: lr schedulers check isinstance(opt, Optimizer)
and edit ``opt.param_groups[i]["lr"]``; here param_groups *is* the wrapped optimizer's
list, so every edit reaches it. ``add_param_group`` works after construction (a
collective: every rank calls it with the same parameters).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist import clip, comm
from minidist.buckets.launcher import is_reduced
from minidist.mesh import DP, group_of
from minidist.precision import MixedPrecisionPolicy
from minidist.verify import verify_same_model
from minidist.zero import state_dict as _sd
from minidist.zero.flat_shards import FlatShards
from minidist.zero.owner_broadcast import OwnerBroadcast

class ShardedOptimizer(torch.optim.Optimizer):
    """Keeps `optimizer_cls` state only for this rank's shard; step() updates every rank's parameters.

    `optimizer_cls(..., **defaults)` is built over this rank's shards. `mp_policy`
    (minidist.precision.MixedPrecisionPolicy): parameters (and compute) in param_dtype,
    gradients reduced in reduce_dtype, fp32 master shards. `module`: the model, for
    `overlap_param_gather` (its forward pre-hooks wait for each bucket's all_gather) and,
    under a param_dtype, to cast its floating inputs. `bucket_cap_mb`: as DDP's.
    """

    def __init__(self, params: Iterable, optimizer_cls: type[torch.optim.Optimizer], *,
                 process_group: dist.ProcessGroup | None = None, mesh: DeviceMesh | None = None, stage: int = 1,
                 owner_broadcast: bool = False, bucket_cap_mb: float | None = None,
                 mp_policy: MixedPrecisionPolicy | None = None, module: nn.Module | None = None,
                 overlap_param_gather: bool = False, **defaults: Any):
        self.process_group = group = group_of("ShardedOptimizer", process_group, mesh)
        self.mesh_dim = mesh.mesh_dim_names[0] if mesh is not None and mesh.mesh_dim_names else DP
        """The name of the mesh dimension this optimizer shards over (its group's; "dp" without a mesh)."""
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        _check_options(stage, owner_broadcast, mp_policy, module, overlap_param_gather)
        self.stage, self.owner_broadcast = stage, owner_broadcast
        self.engine = (OwnerBroadcast(group, bucket_cap_mb) if owner_broadcast else
                       FlatShards(group, stage, bucket_cap_mb, mp_policy, overlap_param_gather))
        self._optimizer_cls, self._kwargs = optimizer_cls, defaults
        self.optim: torch.optim.Optimizer | None = None
        """The wrapped optimizer, over this rank's shards only (param_groups is its list)."""
        self._params: list[nn.Parameter] = []
        super().__init__(params, defaults)  # calls add_param_group for each group
        self.defaults = self.optim.defaults
        if module is not None:
            self.engine.attach(module)

    def add_param_group(self, param_group: dict) -> None:
        """Shard the group's parameters and hand this rank's shards to the wrapped optimizer.

        A collective: every rank must call it with the same parameters (checked), whose values
        are then taken from rank 0.
        """
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        params = [p for p in params if p.requires_grad]  # frozen ones are left alone, as torch skips them
        seen = {id(p) for p in self._params}
        if any(id(p) in seen for p in params) or len({id(p) for p in params}) != len(params):
            raise ValueError("ShardedOptimizer: some parameters appear in more than one parameter group")
        if any(is_reduced(p) for p in params):
            raise ValueError("ShardedOptimizer reduces the gradients itself: pass the parameters of the model "
                             "itself, not of a minidist.DDP wrapper (whose all_reduce would send them twice)")
        if not params:
            raise ValueError("ShardedOptimizer: a parameter group without parameters that require grad")
        first = len(self._params)
        names = [f"param {first + i}" for i in range(len(params))]
        verify_same_model(list(zip(names, params)), [], self.process_group, "ShardedOptimizer")
        comm.broadcast_tensors(params, group=self.process_group)  # every rank starts from rank 0's
        local = self.engine.add_params(params, first, names)
        self._params += params
        inner = {k: v for k, v in param_group.items() if k != "params"} | {"params": local}
        if self.optim is None:
            self.optim = self._optimizer_cls([inner], **self._kwargs)
        else:
            self.optim.add_param_group(inner)
        self._share_groups()

    def _share_groups(self) -> None:
        self.param_groups = self.optim.param_groups
        self.state = self.optim.state

    # ------------------------------------------------------------------ the step
    def step(self, closure: Callable[[], float] | None = None):
        """Update this rank's shards, then return every rank's to every rank (all_gather or broadcasts)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.engine.before_step()
        self.optim.step()
        self.engine.after_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient: the shards' (always set to None: they may be views of a bucket) and the buckets'."""
        self.engine.zero_grad()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside accumulate locally; the first synced backward after it reduces the sum."""
        old = self.engine.require_backward_grad_sync
        self.engine.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.engine.require_backward_grad_sync = old

    def accumulated_grad(self, p: nn.Parameter) -> torch.Tensor:
        """p's gradient as backwards under no_sync summed it on this rank, not yet reduced: a tensor of p's
        shape to add to in place (the flat shards: a view of its bucket's buffer; whole parameters: p.grad)."""
        return self.engine.accumulated_grad(p)

    def reduce_accumulated(self) -> None:
        """Reduce now, outside any backward, what the backwards under no_sync accumulated, as the next synced
        backward would (a collective: every rank of the group calls it). A pipeline does, after its schedule:
        only then are the two copies of a tied weight summed (minidist.pp.compose.deferred)."""
        self.engine.reduce_accumulated()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the gradients so that the global norm is at most max_norm; return that norm (minidist.clip).

        Flat shards hold every element once across the ranks (padding has zero gradient),
        so the squared norms are summed over the group: one all_reduce of a scalar (none
        for the owner-broadcast variant, whose ranks all hold every averaged gradient).
        Parameters also split over another dimension (tensor parallelism) are refused in
        one line: minidist.parallel.parallelize.clip_grad_norm_ sums over every dimension.
        """
        pieces, sharded = self.grad_pieces()
        groups = clip.NamedGroups({self.mesh_dim: self.process_group}, "ShardedOptimizer.clip_grad_norm_",
                                  "minidist.parallel.parallelize.clip_grad_norm_")
        every = [(p, None) for p in self._params] + pieces  # every rank forms the same groups
        return clip.clip_grad_norm_(every, max_norm, groups, device=self._params[0].device, norm_type=norm_type,
                                    also=(self.mesh_dim,) if sharded else ())

    def grad_pieces(self) -> tuple[list[tuple[nn.Parameter, torch.Tensor]], bool]:
        """This rank's averaged gradients, each beside the parameter it belongs to, and whether they are
        shards of the group (True: ZeRO-1/2's pieces of its flat shards, every element on exactly one
        rank; False: the owner-broadcast variant's whole gradients, the same on every rank).

        What minidist.clip reads: each piece's squared norm is summed over the dimensions its
        parameter declares (a tensor-parallel slice over "tp") and, when sharded, over this
        optimizer's dimension (`mesh_dim`). The tensors are views: scaling them in place
        scales what step() applies.
        """
        pieces, sharded = self.engine.grad_pieces()
        return [(self._params[i], g) for i, g in pieces], sharded

    def wait_for_params(self) -> None:
        """Make the model's parameters current (with overlap_param_gather they may still be in flight)."""
        self.engine.wait_for_params()

    @property
    def parameters_in_order(self) -> list[nn.Parameter]:
        """Every parameter this optimizer updates, in the order given (the index of sharded state dicts)."""
        return list(self._params)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard of the state, for the same rank at the same world size and layout.

        For a checkpoint that may be resumed at another world size, use sharded_state_dict().
        """
        self.engine.wait_for_params()
        masters = [t.detach().clone() for g in self.param_groups for t in g["params"]] \
            if self.engine.separate_masters else None
        return {"optimizer": self.optim.state_dict(), "world_size": self.world_size, "rank": self.rank,
                "layout": self.engine.signature(), "masters": masters}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("world_size") != self.world_size or state_dict.get("rank") != self.rank:
            raise ValueError(f"ShardedOptimizer.load_state_dict: this state was saved by rank "
                             f"{state_dict.get('rank')} of {state_dict.get('world_size')}; this is rank "
                             f"{self.rank} of {self.world_size}. Each rank must load its own shard, saved at "
                             f"the same world size (sharded_state_dict() resumes at any).")
        if state_dict["layout"] != self.engine.signature():
            raise ValueError("ShardedOptimizer.load_state_dict: the shards differ from the saved ones (another "
                             "model, parameter order, bucket size or variant); use sharded_state_dict()")
        self.optim.load_state_dict(state_dict["optimizer"])
        self._share_groups()
        if state_dict.get("masters") is not None:
            with torch.no_grad():
                for t, saved in zip((t for g in self.param_groups for t in g["params"]), state_dict["masters"]):
                    t.copy_(saved)
            self.engine.after_step()  # the parameters follow their masters

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's shard of the state, keyed by parameter and element range, on the CPU.

        Save every rank's dict; load_sharded_state_dict(all of them) restores the state at any
        world size, bucket size or variant (state_dict.py).
        """
        self.engine.wait_for_params()
        return _sd.sharded_state_dict(self)

    def load_sharded_state_dict(self, shards: list[dict[str, Any]]) -> None:
        """Load from the sharded_state_dict() of ALL saved ranks, saved at any world size."""
        _sd.load_sharded_state_dict(self, shards)
        self._share_groups()


def _check_options(stage: int, owner_broadcast: bool, mp_policy, module, overlap: bool) -> None:
    if stage not in (1, 2):
        raise ValueError(f"ShardedOptimizer: stage={stage!r}; ZeRO stage 1 (optimizer state) or 2 (+ gradients)")
    if owner_broadcast and (stage != 1 or overlap or (mp_policy and mp_policy.param_dtype)):
        raise ValueError("ShardedOptimizer(owner_broadcast=True) is ZeRO-1 on whole parameters in their own dtype: "
                         "stage=2, overlap_param_gather and a param_dtype need the flat shards (the default)")
    if overlap and module is None:
        raise ValueError("ShardedOptimizer(overlap_param_gather=True) needs module=<the model>: its forward "
                         "pre-hooks wait for each bucket's parameters")
