"""ShardedOptimizer: ZeRO-1, any torch optimizer with its state split across ranks.

    model = minidist.DDP(net)                                  # grads are averaged on every rank
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, mesh=mesh, lr=1e-3)   # mesh: 1-D, as DDP's
    loss.backward(); opt.step(); opt.zero_grad()

Memory per rank for P parameters (fp32 AdamW, bytes): params 4P + grads 4P +
state 8P/N, instead of 16P. Cost: after each step the updated parameters
travel from their owner to everyone: one broadcast per (owner, dtype) of the
owner's flat shard, about 4P (N-1)/N bytes received per rank in all (every
share but its own), which is what an all_gather of the shards would move,
without padding the shards to one size.

Checkpoints: state_dict() / load_state_dict() hold one rank's shard for the
same rank at the same world size; sharded_state_dict() /
load_sharded_state_dict(all ranks' dicts) resume at any world size.

Why subclass torch.optim.Optimizer: lr schedulers (and anything else that
reads `param_groups`) check isinstance(opt, Optimizer) and edit
`opt.param_groups[i]["lr"]`. Our param_groups hold *all* parameters (so
zero_grad clears every grad); the inner optimizer's groups hold this rank's
share, and every hyperparameter is copied outer -> inner at each step(), so a
scheduler's change reaches the inner optimizer.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.mesh import group_of
from minidist.verify import verify_same_model
from minidist.zero.partition import partition_by_numel


class ShardedOptimizer(torch.optim.Optimizer):
    """Keeps `optimizer_cls` state only for this rank's share; step() updates every rank's params."""

    def __init__(self, params: Iterable, optimizer_cls: type[torch.optim.Optimizer], *,
                 process_group: dist.ProcessGroup | None = None, mesh: DeviceMesh | None = None, **kwargs: Any):
        groups = list(params)
        if not groups:
            raise ValueError("ShardedOptimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        groups = [dict(g, params=list(g["params"])) for g in groups]
        self.process_group = process_group = group_of("ShardedOptimizer", process_group, mesh)
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        all_params = [p for g in groups for p in g["params"]]
        verify_same_model([(f"param {i}", p) for i, p in enumerate(all_params)], [], process_group, "ShardedOptimizer")
        self._owner = partition_by_numel(all_params, self.world_size)
        owner_of = {id(p): r for p, r in zip(all_params, self._owner)}
        local = [dict(g, params=[p for p in g["params"] if owner_of[id(p)] == self.rank]) for g in groups]
        self.optim = optimizer_cls(local, **kwargs)
        """The wrapped optimizer, over this rank's share only (its groups align with ours)."""
        self._initialising = True
        super().__init__(groups, self.optim.defaults)
        self._initialising = False
        self.state = self.optim.state  # this rank's shard of the state, nothing more
        self._shards = self._plan_broadcasts(all_params)

    def _plan_broadcasts(self, params: list[torch.Tensor]) -> list[tuple[int, list[torch.Tensor]]]:
        """[(owner's group rank, its params of one dtype/device)]: one broadcast each per step."""
        plan: dict[tuple, list[torch.Tensor]] = {}
        for p, r in zip(params, self._owner):
            plan.setdefault((r, p.dtype, p.device), []).append(p)
        return [(r, ps) for (r, _, _), ps in sorted(plan.items(), key=lambda kv: kv[0][0])]

    def add_param_group(self, param_group: dict) -> None:
        if not getattr(self, "_initialising", False):
            raise NotImplementedError("ShardedOptimizer: add_param_group after construction is not supported; "
                                      "pass every group to the constructor (the partition is fixed then)")
        super().add_param_group(param_group)

    def owned_parameters(self) -> list[torch.Tensor]:
        return [p for g in self.optim.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        """Sync hyperparameters in, update this rank's share, then send each share to every rank."""
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        loss = self.optim.step(closure)
        self._broadcast_shards()
        return loss

    def _broadcast_shards(self) -> None:
        if self.world_size == 1:
            return
        flats = []
        me = self.rank
        for src, ps in self._shards:  # launch all, then wait: the N broadcasts can overlap
            if src == me:  # the owner sends its freshly updated share ...
                flat = torch.cat([p.detach().reshape(-1) for p in ps])
            else:  # ... everyone else receives it into scratch space
                flat = torch.empty(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
            flats.append((flat, ps, comm.broadcast(flat, group=self.process_group, group_src=src, async_op=True)))
        for (src, _), (flat, ps, work) in zip(self._shards, flats):
            work.wait()
            if src == me:
                continue
            offset = 0
            for p in ps:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard of the state, to be loaded back by the same rank at the same world size.

        For a checkpoint that may be resumed at another world size, use sharded_state_dict().
        """
        return {"shard": self.optim.state_dict(), "world_size": self.world_size, "rank": self.rank,
                "owner": list(self._owner),
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("world_size") != self.world_size or state_dict.get("rank") != self.rank:
            raise ValueError(f"ShardedOptimizer.load_state_dict: this state was saved by rank "
                             f"{state_dict.get('rank')} of {state_dict.get('world_size')}; this is rank "
                             f"{self.rank} of {self.world_size}. Each rank must load its own shard, saved at "
                             f"the same world size.")
        if state_dict["owner"] != self._owner:
            raise ValueError("ShardedOptimizer.load_state_dict: the parameter partition differs from the saved "
                             "one (different model or parameter order)")
        self.optim.load_state_dict(state_dict["shard"])
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        self.state = self.optim.state

    def _all_params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's shard of the state, keyed by parameter position (over all groups), on the CPU.

        Save every rank's dict; load_sharded_state_dict(all of them) restores the
        state at any world size (the FSDP engine's sharded_state_dict convention).
        """
        index = {id(p): i for i, p in enumerate(self._all_params())}
        state = {index[id(p)]: {k: v.detach().clone().cpu() if isinstance(v, torch.Tensor) else v
                                for k, v in st.items()} for p, st in self.optim.state.items()}
        return {"world_size": self.world_size, "rank": self.rank, "state": state,
                "shapes": [tuple(p.shape) for p in self._all_params()],
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def load_sharded_state_dict(self, shards: list[dict[str, Any]]) -> None:
        """Load from the sharded_state_dict() of ALL saved ranks, saved at any world size.

        Each parameter's state comes whole from its saved owner; this rank keeps
        the entries of the parameters it owns under the current partition.
        """
        by_rank = {s["rank"]: s for s in shards}
        saved_world = shards[0]["world_size"] if shards else 0
        if not shards or sorted(by_rank) != list(range(saved_world)):
            raise ValueError(f"ShardedOptimizer.load_sharded_state_dict: need the sharded state dicts of all "
                             f"{saved_world} saved ranks, got ranks {sorted(by_rank)}")
        shapes = [tuple(p.shape) for p in self._all_params()]
        if [tuple(s) for s in shards[0]["shapes"]] != shapes:
            raise ValueError("ShardedOptimizer.load_sharded_state_dict: the saved parameter shapes differ from "
                             "this optimizer's (different model or parameter order)")
        state: dict[int, dict[str, Any]] = {}
        for s in shards:
            state.update(s["state"])
        index = {id(p): i for i, p in enumerate(self._all_params())}
        inner = self.optim.state_dict()  # the inner optimizer's own numbering of this rank's parameters
        owned = [index[id(p)] for g in self.optim.param_groups for p in g["params"]]
        # clone: the optimizer updates its state in place and must not write into the checkpoint
        inner["state"] = {j: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state[i].items()}
                          for j, i in enumerate(owned) if i in state}
        inner["param_groups"] = [dict(saved, params=g["params"])
                                 for saved, g in zip(shards[0]["param_groups"], inner["param_groups"])]
        self.optim.load_state_dict(inner)
        for g, saved in zip(self.param_groups, shards[0]["param_groups"]):
            g.update(saved)
        self.state = self.optim.state
