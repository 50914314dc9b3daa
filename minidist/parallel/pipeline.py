"""Pipeline parallelism in the trainer: the GPT cut into stages, this rank's wrapped by the strategy's engine.

    check(cfg)                                                   # one line for a pp config that cannot run
    model = pipeline_model(model, layout, cfg.strategy, m, blocks, policy)   # this rank's stages, one module
    optimizer = build_optimizer(model, layout, cfg.strategy, cfg.optim, policy)   # the record's, as ever
    attach_optimizer(model, optimizer, record)   # (build_optimizer does) ZeRO's reduction at the step's end
    loss = model.pipeline.step(x, target=y)                      # minidist.train.pipeline_step

With strategy.pp_size = P > 1 the layout's outermost dimension is "pp" (minidist.mesh). Every
rank builds the whole GPT alike (same seed), cuts it into P x v stages (minidist.pp.split_gpt)
and keeps stages_of(its pp coordinate); tensor parallelism, where asked, is applied to the whole
model first (tp inside each stage), then context parallelism (each stage's attention is ring
attention over "cp", its positions the chunks' global ones, the last stage's loss the mean over
every cp rank's tokens: minidist.cp.plan; the cp ranks of a stage run the same schedule in step,
and the pipeline step computes on local_batch's tokens). Each kept stage is wrapped by the strategy's own engine over
the data-parallel ranks, through its record's wrap_model (the record stays the one place that
knows the engine), and its backwards run in pp.gradient_sync(engine): only a stage's last
backward of the step reduces, so FSDP's reduce_scatter and DDP's all_reduce run once per step,
not once per micro-batch.

PipelineModel is what the loop, the optimizer and the checkpoints see: one module holding this
rank's layers under the whole model's names (blocks.3.attn.qkv.weight; the tied head's copy on
the last stage is lm_head.weight), so that optimizer state by name, whole-model files and their
shapes read the same at any pp. Under a sharding engine (the record's contract ShardedModel) it
offers that contract by delegating to each stage's engine (a shard file holds one entry per
stage); `.module` is itself, as unwrap() expects of an engine.

ZeRO (zero1, zero2, zero1_broadcast) wraps no stage: its one optimizer over the rank's stages
reduces the gradients, and it does so once after the schedule (attach_optimizer: every backward
accumulates, the GPT's tied head is summed with its twin on the local gradients, then
ShardedOptimizer.reduce_accumulated; minidist.pp.compose.deferred says why).

zb_h1 runs the weight gradients in later, separate backwards (minidist.pp.backward), after the
backward that ends: DDP's reducer then reduces after the schedule too (minidist.pp.compose.deferred),
and zb_h1 is refused under FSDP, whose reduce_scatter and freeing of the gathered weights run when a
backward ends. fp16 loss scaling and trainer.grad_accum > 1 are refused too: the pipeline runs its
own backwards (trainer.microbatches is its accumulation).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn as nn

from minidist import pp, strategies
from minidist.mesh import PP, Layout
from minidist.precision import MixedPrecisionPolicy
from minidist.runtime import UsageError
from minidist.strategies import contract


# ----------------------------------------------------------------------------- config
def check(cfg) -> None:
    """ValueError (one line naming the setting) unless the pipeline settings can run; the world is
    the layout's to check (ParallelDims names strategy.pp_size)."""
    st, tc = cfg.strategy, cfg.trainer
    p, v, m = st.get("pp_size", 1), st.get("pp_virtual", 1), tc.get("microbatches", 1)
    if p < 1 or v < 1 or m < 1:
        raise ValueError(f"strategy.pp_size={p}, strategy.pp_virtual={v} and trainer.microbatches={m} must be >= 1")
    if p == 1:
        if m != 1:
            raise ValueError(f"trainer.microbatches={m} cuts the batch for a pipeline: set strategy.pp_size > 1, "
                             f"or accumulate with trainer.grad_accum={m}")
        return
    record = strategies.get(st.name)
    if cfg.model.name != "gpt":
        raise ValueError(f"strategy.pp_size={p}: the pipeline cuts model=gpt only, not model={cfg.model.name}; "
                         f"use strategy.pp_size=1")
    if st.pp_schedule == "zb_h1" and record.model_engine is contract.ShardedModel:
        raise ValueError(f"strategy.pp_schedule=zb_h1 with strategy={st.name}: FSDP reduce_scatters and frees the "
                         f"gathered weights when a backward ends, and zb_h1 defers the weight gradients past it; "
                         f"use gpipe, 1f1b or interleaved_1f1b, or strategy=ddp or a ZeRO one")
    if tc.grad_accum != 1:
        raise ValueError(f"trainer.grad_accum={tc.grad_accum} with strategy.pp_size={p}: the pipeline accumulates "
                         f"over trainer.microbatches; set trainer.grad_accum=1 and "
                         f"trainer.microbatches={m * tc.grad_accum}")
    if tc.precision.value == "fp16":
        raise ValueError(f"trainer.precision=fp16 with strategy.pp_size={p}: loss scaling is not wired into the "
                         f"pipeline's backwards; use trainer.precision=bf16 or fp32")
    stages, n = p * v, cfg.model.n_layer
    if n % stages:
        valid = ", ".join(str(d) for d in range(1, n + 1) if n % (d * v) == 0)
        raise ValueError(f"strategy.pp_size={p} x pp_virtual={v} = {stages} stages must divide model.n_layer={n} "
                         f"(equal stages); valid pp_size: {valid}")
    if tc.batch_size % m:
        valid = ", ".join(str(d) for d in range(1, tc.batch_size + 1) if tc.batch_size % d == 0)
        raise ValueError(f"trainer.microbatches={m} must divide trainer.batch_size={tc.batch_size} (equal "
                         f"micro-batches keep the mean loss exact); valid: {valid}")
    schedule(st, m)


def schedule(strategy_cfg, microbatches: int) -> pp.Schedule:
    """The schedule strategy.pp_schedule names, built and checked (ValueError: one line)."""
    st = strategy_cfg
    try:
        sched = pp.build(st.pp_schedule, st.pp_size, microbatches, st.get("pp_virtual", 1))
        pp.check(sched)
    except ValueError as exc:  # ScheduleError included
        raise ValueError(f"strategy.pp_schedule={st.pp_schedule} (pp_size={st.pp_size}, pp_virtual="
                         f"{st.get('pp_virtual', 1)}, trainer.microbatches={microbatches}): {exc}") from None
    return sched


# ----------------------------------------------------------------------------- model
class PipelineModel(nn.Module):
    """This rank's stages as one module under the whole model's names (module docstring); `pipeline` runs them."""

    def __init__(self, stages: list[pp.Stage], pipeline: pp.Pipeline):
        super().__init__()
        for stage in stages:
            for name, child in stage.module.named_children():
                if isinstance(child, nn.ModuleDict):  # blocks: a new dict, several stages' under interleaving
                    if name not in self._modules:
                        setattr(self, name, nn.ModuleDict())
                    self._modules[name].update(child)
                else:
                    setattr(self, name, child)
        self.__dict__["module"] = self  # unwrap(): the engines' .module; not a child (no cycle)
        self.__dict__["stages"] = list(stages)
        self.__dict__["pipeline"] = pipeline

    def forward(self, *args: Any) -> Any:
        raise RuntimeError("a PipelineModel runs through its pipeline: model.pipeline.step(x, target=y) for "
                           "training, minidist.pp.forward for evaluation")

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to skip here: the pipeline tells each stage's engine which backward reduces."""
        return contextlib.nullcontext()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """The whole model's state: this rank's layers take theirs (the other stages' keys are not theirs)."""
        own = self.state_dict().keys()
        return super().load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict, assign)

    # -- the ShardedModel contract, stage by stage (under FSDP) ------------------------------------
    def full_state_dict(self, rank0_only: bool = True, cpu_offload: bool = True) -> dict[str, torch.Tensor]:
        """This rank's stages' whole tensors (a collective over each engine's group); minidist.parallel
        gathers the stages over "pp"."""
        out: dict[str, torch.Tensor] = {}
        for s in self.stages:
            out |= s.runner.full_state_dict(rank0_only=rank0_only, cpu_offload=cpu_offload)
        return out

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        for s in self.stages:
            own = s.module.state_dict().keys()
            s.runner.load_full_state_dict({k: v for k, v in state_dict.items() if k in own})

    def sharded_state_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """{"stages": {stage index: its engine's shards, with the optimizer state of its parameters}}."""
        return {"stages": {str(s.index): s.runner.sharded_state_dict(_slice(optimizer, s)) for s in self.stages}}

    def load_sharded_state_dict(self, shards: list[dict[str, Any]],
                                optimizer: torch.optim.Optimizer | None = None) -> None:
        """Every saved rank's file of this pipeline rank (the checkpoint checked that pp is the same)."""
        saved, mine = sorted(int(k) for k in shards[0]["stages"]), sorted(s.index for s in self.stages)
        if saved != mine:
            raise UsageError(f"the checkpoint's shards hold stages {saved} on this pipeline rank, this run cuts "
                             f"stages {mine}: resume with the strategy.pp_virtual that wrote it")
        for s in self.stages:
            view = _slice(optimizer, s)
            s.runner.load_sharded_state_dict([sh["stages"][str(s.index)] for sh in shards], optimizer=view)
            if view is not None:
                optimizer.state.update(view.state)
                view.update_groups()


class _OptimizerSlice:
    """The part of one optimizer over one stage's parameters, as an engine's state-dict functions read it
    (.state and .param_groups): one optimizer steps every stage of the rank."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: set[int]):
        self.state = {p: st for p, st in optimizer.state.items() if id(p) in params}
        self.param_groups = [g | {"params": [p for p in g["params"] if id(p) in params]} for g in optimizer.param_groups]
        self._groups = optimizer.param_groups

    def update_groups(self) -> None:
        for mine, group in zip(self.param_groups, self._groups):
            group.update({k: v for k, v in mine.items() if k != "params"})


def _slice(optimizer: torch.optim.Optimizer | None, stage: pp.Stage) -> _OptimizerSlice | None:
    return None if optimizer is None else _OptimizerSlice(optimizer, {id(p) for p in stage.module.parameters()})


def pipeline_model(model: nn.Module, layout: Layout, strategy_cfg, microbatches: int, block_types: tuple[type, ...],
                   policy: MixedPrecisionPolicy | None) -> PipelineModel:
    """`model` (a GPT on its device; tensor-parallel already where tp > 1) cut over "pp", this rank's stages
    wrapped by the strategy's engine (its record's wrap_model) over the data-parallel ranks."""
    st = strategy_cfg
    sched = schedule(st, microbatches)
    cut = pp.split_gpt(model, sched.num_stages)
    record = strategies.get(st.name)
    stages = []
    for s in sched.stages_of(layout.coordinate[PP]):
        module = cut.modules[s]
        runner = record.wrap_model(module, layout, st, block_types, policy)
        engine = record.model_engine is not None
        stages.append(pp.Stage(module, s, cut.num_stages, runner=runner if engine else None,
                               sync=pp.gradient_sync(runner) if engine else None))
    pipe = pp.Pipeline(stages, sched, layout[PP], cut.loss_fn, ties=cut.ties)
    if sched.splits_backward and record.model_engine is contract.ModelWrapper:  # DDP: reduce after the schedule
        pipe.defer(pp.deferred([s.runner for s in stages]))
    return PipelineModel(stages, pipe)



def attach_optimizer(model: PipelineModel, optimizer: torch.optim.Optimizer, record: strategies.Strategy) -> None:
    """Where the optimizer reduces the gradients (ZeRO: record.optimizer_engine), the pipeline defers that
    reduction to the end of its schedule (minidist.pp.compose.deferred); with a model engine, nothing to do."""
    if record.optimizer_engine is contract.ShardedOptimizerState:
        model.pipeline.defer(pp.deferred([optimizer]))
