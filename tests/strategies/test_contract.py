"""Every registered strategy's engines offer the contract its record names (minidist.strategies.contract),
member by member and argument by argument, so the loop and the checkpoints may call it without probing;
a record that names no contract hands back the model itself and a torch optimizer."""

from __future__ import annotations

import inspect
from typing import Protocol

from minidist.strategies import contract

NO_CONTRACT = (Protocol, object)


def members(protocol: type) -> dict[str, list[str] | None]:
    """{member: its parameter names (methods), or None (attributes and properties)} of a protocol and its bases."""
    out: dict[str, list[str] | None] = {}
    for cls in reversed(protocol.__mro__):
        if cls in NO_CONTRACT or not getattr(cls, "_is_protocol", False):
            continue
        out |= {name: None for name in getattr(cls, "__annotations__", {})}
        for name, value in vars(cls).items():
            if isinstance(value, property):
                out[name] = None
            elif inspect.isfunction(value) and not name.startswith("_"):
                out[name] = list(inspect.signature(value).parameters)[1:]
    return out


def missing(obj, protocol: type) -> list[str]:
    """What `obj` lacks of `protocol`: members, or arguments under the contract's names."""
    gaps = []
    for name, params in members(protocol).items():
        if not hasattr(obj, name):
            gaps.append(name)
        elif params is not None:
            have = list(inspect.signature(getattr(obj, name)).parameters)
            gaps += [f"{name}({p}=)" for p in params if p not in have]
    return gaps


def _engines() -> dict:
    from minidist import runtime, strategies
    from minidist.cli import compose_config
    from minidist.mesh import ParallelDims
    from minidist.models import Block
    from minidist.parallel.parallelize import build_layout, build_optimizer, parallelize
    from minidist.train.task import make_task

    topo = runtime.init("gloo")
    out = {}
    for record in strategies.records():
        cfg = compose_config(["experiment=gpt_tiny", f"strategy={record.name}"], world=(None, None))
        try:
            layout = build_layout(cfg.strategy, topo)
        except ValueError:  # single: one process; its (absent) engines over any layout
            layout = ParallelDims.infer(topo.world_size).build("cpu")
        plain = make_task(cfg.model).build()[0]
        model = parallelize(plain, layout, cfg.strategy, (Block,))
        opt = build_optimizer(model, layout, cfg.strategy, cfg.optim)
        out[record.name] = {
            "model": missing(model, record.model_engine) if record.model_engine else model is plain,
            "optimizer": missing(opt, record.optimizer_engine) if record.optimizer_engine else
            type(opt).__module__.startswith("torch.optim.")}
    return out


def test_the_contract_lists_what_the_loop_calls():
    assert set(members(contract.ShardedModel)) == {"module", "no_sync", "full_state_dict", "load_full_state_dict",
                                                   "sharded_state_dict", "load_sharded_state_dict"}
    assert members(contract.ShardedOptimizerState)["load_sharded_state_dict"] == ["shards"]

    class Partial:
        module = None

        def no_sync(self):
            return None
    assert missing(Partial(), contract.ModelWrapper) == []
    assert missing(Partial(), contract.ShardedModel)[:1] == ["full_state_dict"]


def test_every_record_s_engines_offer_its_contract(run_dist):
    from minidist import strategies
    for got in run_dist(2, _engines):
        assert set(got) >= {r.name for r in strategies.records()}
        for name, sides in got.items():
            assert sides["model"] in (True, []), (name, "model", sides["model"])
            assert sides["optimizer"] in (True, []), (name, "optimizer", sides["optimizer"])
