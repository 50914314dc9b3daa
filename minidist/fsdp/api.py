"""The public FSDP module: choose units, shard their parameters, with FSDP2's arguments.

    model = FSDP(GPT(cfg), wrap={Block})                       # ZeRO-3 over the world
    model = FSDP(GPT(cfg), wrap={Block}, mesh=hybrid_mesh(topo, shard=8), reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters())     # this rank's rows of every parameter
    loss = model(x, y)[1]; loss.backward(); opt.step()

Every parameter is sharded on its own along dim 0 (FSDP2's arrangement, minidist.fsdp.shard_spec):
the optimizer sees, under the original names, rank r's rows of each parameter with its
trailing dimensions, and each carries its ShardSpec (`p.shard_spec`). A unit is still
gathered by one all_gather and reduced by one reduce_scatter (minidist.fsdp.param).

What FSDP1 called sharding strategies are FSDP2's two arguments (N ranks, S bytes of the padded
parameters; bytes sent per rank per step, ring model; the recipes keep FSDP1's names for them):

    mesh 1-D, reshard_after_forward=True      full_shard: params, grads,          (3 S - S_root) (N-1)/N
                                              optimizer state sharded (ZeRO-3)
                                              (S_root: the unit that ends forward, the root when it
                                              holds parameters, is not gathered again in backward)
    mesh 1-D, reshard_after_forward=False     shard_grad_op: params stay gathered   2 S (N-1)/N
                                              from forward to backward (ZeRO-2)
    mesh (replicate R, shard G)               HSDP (hybrid_shard): full_shard inside groups of G ranks,
                                              replicated across R = N/G: reduce_scatter in the shard
                                              group, all_reduce of the shard across replicas
    mesh (replicate N, shard 1)               no_shard: every rank holds everything;   2 S (N-1)/N
                                              all_reduce (= DDP)

Persistent memory per rank for fp32 AdamW (psi parameters): params 4 psi, grads 4 psi,
Adam moments 8 psi; sharded, (4 + 4 + 8) psi / N (full_shard; up to the padding rows: a rank
holds ceil(R/N) rows of each parameter), 4 psi + 12 psi / N (shard_grad_op keeps params
whole only between forward and backward, so also 16 psi / N between steps).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist import clip
from minidist.arguments import refuse_renamed
from minidist.fsdp import state_dict as _sd
from minidist.fsdp.param import ParamInfo, UnitShards
from minidist.fsdp.schedule import Schedule
from minidist.fsdp.shard_spec import CPUOffloadPolicy, resolve_mesh
from minidist.fsdp.streams import Streams
from minidist.fsdp.unit import FSDPUnit, UnitPolicy
from minidist.precision import MixedPrecisionPolicy
from minidist.verify import verify_same_model

WrapPolicy = Iterable[type[nn.Module]] | Callable[[nn.Module], bool] | None

_PREFETCH = ("explicit prefetch: model.units[i].set_modules_to_forward_prefetch([...]) / "
             "set_modules_to_backward_prefetch([...]) (FSDP2's; default: one unit ahead)")
RENAMED = {
    "sharding_strategy": "reshard_after_forward=True (full_shard) or False (shard_grad_op), and for hybrid "
                         "sharding or no_shard a mesh with dimensions ('replicate', 'shard') (shard size 1: "
                         "no_shard), as FSDP2",
    "forward_prefetch": _PREFETCH, "backward_prefetch": _PREFETCH, "max_inflight_all_gathers": _PREFETCH,
    "param_dtype": "mp_policy=MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)",
    "reduce_dtype": "mp_policy=MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)",
    "mixed_precision": "mp_policy=MixedPrecisionPolicy(...)",
    "device_mesh": "mesh=",
}
"""FSDP1's argument names, refused in one line naming FSDP2's (minidist.arguments)."""


def wrap_predicate(policy: WrapPolicy) -> Callable[[nn.Module], bool]:
    """`wrap` (module classes, a predicate, or None) as a predicate: is this module its own unit?"""
    if policy is None:
        return lambda m: False
    if callable(policy) and not isinstance(policy, (set, frozenset, list, tuple)):
        return policy
    classes = tuple(policy)
    return lambda m: isinstance(m, classes)


def build_units(root: nn.Module, is_unit: Callable[[nn.Module], bool]
                 ) -> list[tuple[str, nn.Module, list[ParamInfo]]]:
    """Assign every parameter to one unit: the innermost unit holding all its uses.

    A tied parameter used by modules of different units goes to their lowest common
    unit ancestor (often the root), which is unsharded whenever any of them runs.
    Returns (name, module, params) in module order, root first.
    """
    unit_of: dict[nn.Module, nn.Module] = {root: root}
    chain: dict[nn.Module, list[nn.Module]] = {root: [root]}  # unit ancestry, outermost first
    names = {root: ""}
    for name, m in root.named_modules():
        if m is root:
            continue
        parent = root.get_submodule(name.rpartition(".")[0]) if "." in name else root
        up = unit_of[parent]
        if is_unit(m):
            unit_of[m], chain[m], names[m] = m, chain[up] + [m], name
        else:
            unit_of[m] = up
    params: dict[int, ParamInfo] = {}
    for mname, m in root.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is None:
                continue
            fqn = f"{mname}.{pname}" if mname else pname
            info = params.setdefault(id(p), ParamInfo([], [], p))
            if (m, pname) not in info.holders:
                info.fqns.append(fqn)
                info.holders.append((m, pname))
    by_unit: dict[nn.Module, list[ParamInfo]] = {u: [] for u in chain}
    for info in params.values():
        chains = [chain[unit_of[m]] for m, _ in info.holders]
        common = chains[0]
        for c in chains[1:]:
            k = 0
            while k < min(len(common), len(c)) and common[k] is c[k]:
                k += 1
            common = common[:k]
        by_unit[common[-1]].append(info)
    return [(names[u], u, infos) for u, infos in by_unit.items()]


def _compute_device(module: nn.Module, mesh: DeviceMesh | None, offload: CPUOffloadPolicy | None) -> torch.device:
    """Where the unit computes: the module's device; under CPU offload of a CPU module, the mesh's GPU."""
    first = next(module.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    if offload is not None and device.type == "cpu" and mesh is not None and mesh.device_type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _move_buffers(module: nn.Module, device: torch.device) -> None:
    """Buffers (not sharded, not offloaded) live where the compute runs."""
    for m in module.modules():
        for name, b in m._buffers.items():
            if b is not None and b.device != device:
                m._buffers[name] = b.to(device)


class FSDP(nn.Module):
    """Fully sharded data parallel wrapper. See the module docstring and minidist.fsdp.unit.

    module: the model, already on its compute device (the shards are views of buffers built
        here; under CPU offload it may stay on the CPU while the mesh is on the GPUs).
    mesh: a DeviceMesh (FSDP2's convention), read by dimension name (minidist.mesh). 1-D:
        the ranks that shard the parameters. With dimensions REPLICATE and SHARD: HSDP,
        sharded within SHARD and replicated across REPLICATE (minidist.mesh.hybrid_mesh);
        a SHARD of size 1 replicates everything (no_shard). Other dimensions (tensor
        parallelism) are not FSDP's. process_group: a plain group instead of a 1-D mesh.
        Neither = the world.
    wrap: module classes, or a predicate on a module, choosing the units; the parameters
        no unit claims form the root unit.
    reshard_after_forward: FSDP2's. True frees each unit's unsharded parameters after its
        forward and gathers them again in backward; False keeps them until its backward (one
        all_gather per unit per step, the whole model's parameters alive at the end of
        forward). Either way the unit whose forward ends last (the root) stays gathered, as
        FSDP2 keeps its root's. An int (FSDP2: reshard to a smaller group) is refused: the
        backward all_gather always spans the shard group.
    Prefetch: each unit issues the next unit's all_gather as soon as its own parameters are
        installed (one unit ahead, FSDP2's default); FSDPUnit.set_modules_to_forward_prefetch
        / set_modules_to_backward_prefetch on `model.units` set explicit lists, and
        prefetch_ahead() sets them by module order (minidist.fsdp.schedule).
    mp_policy: mixed precision, see MixedPrecisionPolicy; gradients are reduced in
        reduce_dtype with fp16's pre/post division (minidist.fsdp.reduce_scatter).
    offload_policy: CPUOffloadPolicy() keeps shards, gradients and optimizer state in host
        memory (FSDP2's option); the unit's all_gather input is copied to the compute device.

    Parameters keep their names under `.module` (fsdp.module.named_parameters() gives the
    plain module's names); their values are this rank's rows of each parameter (shape
    (rows, *trailing dims), `p.shard_spec` says which), which the optimizer updates. Wrap
    before building the optimizer; do not move the module afterwards.

    FSDP1's argument names (sharding_strategy, forward_prefetch, backward_prefetch,
    max_inflight_all_gathers, param_dtype, reduce_dtype) are refused in one line naming these.

    Public attributes: `units` (each unit's `shards`: its FSDPParams and buffers, and its
    states), `mesh_info` (groups, this rank's place in them, dimension names),
    `shard_group`, `compute_device`, `streams`. `require_backward_grad_sync` (torch DDP's
    name) is False inside no_sync(). Activation checkpointing (non-reentrant
    torch.utils.checkpoint) may sit inside a unit, around a unit's call or around several
    units: see minidist.fsdp.unit.
    """

    def __init__(self, module: nn.Module, *, mesh: DeviceMesh | None = None,
                 process_group: dist.ProcessGroup | None = None, wrap: WrapPolicy = None,
                 reshard_after_forward: bool | int = True, mp_policy: MixedPrecisionPolicy | None = None,
                 offload_policy: CPUOffloadPolicy | None = None, **renamed):
        refuse_renamed("FSDP", renamed, RENAMED)
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"FSDP: reshard_after_forward={reshard_after_forward!r}: True or False; an int "
                             f"(FSDP2's reshard to a smaller group) is not supported by minidist.FSDP")
        super().__init__()
        self.module = module
        self.mp_policy = mp_policy or MixedPrecisionPolicy()
        self.reshard_after_forward = reshard_after_forward
        self.mesh_info = info = resolve_mesh(mesh, process_group)
        for group, world in ((info.shard_group, info.shard_world), (info.replicate_group, info.replicate_world)):
            if world > 1:  # different models would shard into different sizes: gloo aborts, NCCL hangs
                verify_same_model(module.named_parameters(), module.named_buffers(), group, "FSDP")
        policy = UnitPolicy(reshard_after_forward and info.shard_world > 1, self.mp_policy.reduce_dtype)
        self.offload_policy = offload_policy
        self.compute_device = device = _compute_device(module, mesh, offload_policy)
        _move_buffers(module, device)
        self.streams = Streams(device)
        self._schedule: Schedule[FSDPUnit] = Schedule()
        self._units: list[FSDPUnit] = []
        for name, m, infos in build_units(module, wrap_predicate(wrap)):
            shards = UnitShards(infos, info, device, self.mp_policy.param_dtype, offload_policy)
            self._units.append(FSDPUnit(m, shards, info, policy, self._schedule, self.streams, name))
        self._schedule.units = self._units

    # -- forward --------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        dtype = self.mp_policy.param_dtype
        if dtype is not None:  # as torch's cast_forward_inputs: the root feeds compute dtype
            cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        self._schedule.begin_forward()
        out = self.module(*args, **kwargs)
        self._schedule.end_forward()
        if not torch.is_grad_enabled():  # no backward will come to free what forward kept
            for unit in self._units:
                unit.reshard()
        return out

    @property
    def require_backward_grad_sync(self) -> bool:
        """Whether the next backward reduces gradients (torch DDP's name); False inside no_sync()."""
        return self._schedule.require_backward_grad_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self._schedule.require_backward_grad_sync = bool(value)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside accumulate unsharded gradients locally (no reduction).

        The full gradients stay alive (S bytes per rank) until the next synced backward
        reduces them: gradient accumulation trades memory for 1/K of the reductions.
        """
        prev = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = prev

    # -- gradient clipping ----------------------------------------------------------------------
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the sharded gradients so that the global gradient norm is at most max_norm (minidist.clip).

        Each element of the model lives in exactly one shard of the shard group (padding
        rows are not part of any sharded parameter), so a sum over the shard group's local
        sums counts every element once; replicas (HSDP, no_shard) hold copies and are not
        summed again. Parameters also split over another dimension (tensor parallelism) are
        refused in one line: minidist.parallel.parallelize.clip_grad_norm_ sums over every
        dimension. Under CPU offload the norm travels to the compute device for the
        all_reduce and the scaling happens where the grads are.
        """
        info = self.mesh_info
        groups = clip.NamedGroups({info.shard_dim: info.shard_group} if info.shard_dim else {},
                                  "FSDP.clip_grad_norm_", "minidist.parallel.parallelize.clip_grad_norm_")
        pieces = [(fp.sharded, fp.sharded.grad) for u in self._units for fp in u.shards.params]
        return clip.clip_grad_norm_(pieces, max_norm, groups, device=self.compute_device, norm_type=norm_type)

    # -- state dicts (minidist.fsdp.state_dict) -------------------------------------------------
    def full_state_dict(self, rank0_only: bool = True, cpu_offload: bool = True) -> dict[str, torch.Tensor]:
        return _sd.full_state_dict(self, rank0_only=rank0_only, cpu_offload=cpu_offload)

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor] | None,
                             broadcast_from_rank0: bool = False) -> None:
        _sd.load_full_state_dict(self, state_dict, broadcast_from_rank0=broadcast_from_rank0)

    def sharded_state_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        return _sd.sharded_state_dict(self, optimizer)

    def load_sharded_state_dict(self, shards: list[dict[str, Any]],
                                optimizer: torch.optim.Optimizer | None = None) -> None:
        _sd.load_sharded_state_dict(self, shards, optimizer)

    # -- introspection --------------------------------------------------------------------------
    @property
    def units(self) -> list[FSDPUnit]:
        """Every unit, module order, root first (each: .module, .shards, .sharded_state, .training_state)."""
        return list(self._units)

    @property
    def shard_group(self) -> dist.ProcessGroup | None:
        """The ranks that split the parameters (None = the world); mesh_info has the rest of the layout."""
        return self.mesh_info.shard_group

    @property
    def peak_unsharded_units(self) -> int:
        """Most units whose unsharded buffer was allocated at the same time (since construction)."""
        return self._schedule.peak_live
