"""A model and its optimizer in whole form, keyed by parameter name: what any layout can load.

    whole = whole_state(model, optimizer, layout, strategy)     # on the main process ({} elsewhere); a collective
    load_whole(model, optimizer, whole, layout, strategy)       # into a replicated model or FSDP's shards

    {"model":     {state_dict key: whole tensor},
     "optimizer": {"state": {parameter name: {"exp_avg": whole tensor, "step": scalar, ...}},
                   "param_groups": [{hyperparameters..., "params": [parameter name, ...]}]}}

A torch optimizer numbers its parameters by position; positions mean nothing to a model
wrapped another way, names do. Loading cuts each tensor to what this rank holds:

- a replicated model (single, DDP): its tensor-parallel slice (minidist.parallel.placement);
- a sharded model (FSDP; its record's contract, minidist.strategies.contract.ShardedModel):
  the engine's load_full_state_dict places whole tensors into its shards. The
  optimizer state goes the same way: each elementwise state tensor (Adam's moments,
  SGD's momentum, shaped like its parameter) is loaded as if it were the weights and
  read back from the shards, then the weights themselves are loaded. This uses FSDP's
  public API only, so it holds for any way the engine cuts its shards.

Only state tensors shaped like their parameter are cut; anything else (Adam's step) is
the same on every rank and copied as is.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.mesh import TP, Layout
from minidist.parallel import placement
from minidist.parallel.parallelize import full_state_dict, unwrap
from minidist.strategies import contract
from minidist.strategies.record import Strategy


def _names(module: nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name (the one named_parameters() reports)."""
    return {id(p): n for n, p in module.named_parameters()}


def optimizer_by_name(optimizer: torch.optim.Optimizer, module: nn.Module) -> dict:
    """A plain optimizer's state_dict with every parameter position replaced by the parameter's name.

    A tied parameter's state is kept under each of its names (the same tensors: saved once): a
    pipeline holds the GPT's head and embedding as two copies on two stages, each finding its own."""
    names: dict[int, list[str]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    sd = optimizer.state_dict()
    return {"state": {n: st for i, st in sd["state"].items() for n in order[i]},
            "param_groups": [dict(g, params=[order[i][0] for i in g["params"]]) for g in sd["param_groups"]]}


def optimizer_from_positions(sd: dict, module: nn.Module) -> dict:
    """optimizer_by_name of a state_dict saved by position (checkpoints before names): positions
    follow module.parameters(), the order the recipes build their optimizer in."""
    order = [n for n, _ in module.named_parameters()]
    return {"state": {order[i]: st for i, st in sd["state"].items()},
            "param_groups": [dict(g, params=[order[i] for i in g["params"]]) for g in sd["param_groups"]]}


def _elementwise(by_name: dict, shapes: dict[str, torch.Size]) -> dict[str, dict[str, torch.Tensor]]:
    """{name: {key: tensor}} of the state tensors shaped like their parameter."""
    return {n: {k: v for k, v in st.items() if isinstance(v, torch.Tensor) and v.shape == shapes.get(n)}
            for n, st in by_name["state"].items()}


def whole_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, layout: Layout, strategy: Strategy) -> dict:
    """{"model": ..., "optimizer": ...} (no "optimizer" when None) on the main process, {} elsewhere.

    A collective: tensor-parallel slices of the weights and of the elementwise state are
    gathered along "tp" (nothing to gather without tensor parallelism).
    """
    module = unwrap(model, strategy)
    out = {"model": full_state_dict(model, layout, strategy)}
    if optimizer is None:
        return out if layout.is_main else {}
    by_name = optimizer_by_name(optimizer, module) if layout.dp_rank == 0 else {"state": {}}
    if layout.dp_rank == 0 and layout.size(TP) > 1:
        split = placement.splits(module, TP)
        shapes = {n: p.shape for n, p in module.named_parameters()}
        for name, tensors in _elementwise(by_name, shapes).items():
            flat = placement.gather_whole(tensors, {k: split[name] for k in tensors} if name in split else {},
                                          layout, TP)
            by_name["state"][name] = by_name["state"][name] | flat
    out["optimizer"] = placement.gather_stages(by_name, layout)  # the pipeline's stages joined on the main process
    return out if layout.is_main else {}


@torch.no_grad()
def load_whole(model: nn.Module, optimizer: torch.optim.Optimizer | None, whole: dict, layout: Layout,
               strategy: Strategy) -> None:
    """Load whole_state()'s form (present on every rank) into `model` and `optimizer` (plain ones:
    over the model's parameters, or over FSDP's shards), each cut to this rank's tp slice."""
    module = unwrap(model, strategy)
    split = placement.splits(module, TP)
    weights = placement.local_slice(whole["model"], split, layout, TP)
    sharded = strategy.model_engine is contract.ShardedModel
    if optimizer is not None and "optimizer" in whole:
        shapes = {n: t.shape for n, t in whole["model"].items()}
        state = {}
        for n, st in whole["optimizer"]["state"].items():
            cut = _elementwise({"state": {n: st}}, shapes)[n]
            state[n] = st | placement.local_slice(cut, {k: split[n] for k in cut} if n in split else {}, layout, TP)
        by_name = {"state": state, "param_groups": whole["optimizer"]["param_groups"]}
        if sharded:
            _state_into_shards(model, module, optimizer, by_name, weights)
        else:
            load_optimizer_by_name(optimizer, module, by_name)
    if sharded:
        model.load_full_state_dict(weights)
    else:
        module.load_state_dict(weights)


def load_optimizer_by_name(optimizer: torch.optim.Optimizer, module: nn.Module, by_name: dict) -> None:
    """optimizer_by_name's form into a plain optimizer over `module`'s parameters (as they are now)."""
    name_of = _names(module)
    order = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    position = {n: i for i, n in enumerate(order)}
    sd = optimizer.state_dict()
    sd["state"] = {position[n]: st for n, st in by_name["state"].items() if n in position}
    for group, saved in zip(sd["param_groups"], by_name["param_groups"]):
        group.update({k: v for k, v in saved.items() if k != "params"})
    optimizer.load_state_dict(sd)


def _state_into_shards(model, module: nn.Module, optimizer, by_name: dict, weights: dict) -> None:
    """Cut whole elementwise optimizer state into FSDP's shards through load_full_state_dict."""
    shards = dict(module.named_parameters())  # the shard parameters the optimizer holds, by name
    whole_shapes = {n: weights[n].shape for n in shards}
    elementwise = _elementwise(by_name, whole_shapes)
    cut: dict[str, dict] = {n: dict(st) for n, st in by_name["state"].items() if n in shards}
    for key in sorted({k for st in elementwise.values() for k in st}):
        as_weights = dict(weights) | {n: elementwise.get(n, {}).get(key, torch.zeros_like(weights[n]))
                                      for n in shards}
        model.load_full_state_dict(as_weights)
        for n, p in shards.items():
            if key in elementwise.get(n, {}):
                cut[n][key] = p.detach().clone()
    load_optimizer_by_name(optimizer, module, {"state": cut, "param_groups": by_name["param_groups"]})
