"""One training step of the plain model on fake tensors: activations, temporaries and gradients over time.

    prof = profile_step(GPT(cfg) built on the meta device, batch=(x, y), loss_fn=..., wrap={Block})

FakeTensorMode runs every operator for shapes and dtypes only (no data, no arithmetic),
on a device that is named but never touched, so the kernels chosen are the ones the real
device would run (e.g. CPU flash attention, which saves the output and a log-sum-exp
rather than the T x T attention matrix). MemoryLedger samples after every operator; each
sample records which FSDP unit is running (forward: module hooks; backward: the unit that
saved the tensor backward unpacked last) and every unit's gradient bytes so far.

minidist.compare.estimate turns these samples into a per-strategy peak: it adds what each
engine holds at that point of the step to the plain model's activations and temporaries.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from minidist.compare.memory import MemoryLedger
from minidist.shape import ModelShape


@dataclass(frozen=True)
class Sample:
    """The plain model's step at one operator."""

    backward: bool
    segment: int
    """Index into StepProfile.segments: which unit was running."""
    activations: int
    other: int
    grads: tuple[int, ...]
    """Gradient bytes so far, per unit."""


@dataclass
class StepProfile:
    """What estimate_memory needs to know about a model and its step, independent of the strategy."""

    shape: ModelShape
    """The parameters' sizes: per FSDP unit (minidist.fsdp's own assignment, root first) and in model order."""
    segments: list[int] = field(default_factory=list)
    """The unit of each forward segment, in order: root, unit 1, root, unit 2, ..., root."""
    samples: list[Sample] = field(default_factory=list)

    @property
    def psi(self) -> int:
        return self.shape.psi

    @property
    def itemsize(self) -> int:
        return self.shape.itemsize

    @property
    def unit_numels(self) -> list[int]:
        return list(self.shape.unit_numels)

    def root_stage(self, segment: int, backward: bool) -> int:
        """For a root segment: 0 before the blocks ran in this pass, 1 after (minidist.footprint.At)."""
        blocks = [i for i, u in enumerate(self.segments) if u != 0]
        if not blocks:
            return 0
        if backward:  # backward runs the forward's segments in reverse
            return 0 if segment > blocks[-1] else 1
        return 0 if segment < blocks[0] else 1


def _fake_copy(model: nn.Module, mode: FakeTensorMode, device: torch.device) -> nn.Module:
    """A copy of a meta-device model whose tensors are fake tensors on `device` (ties kept)."""
    fake = copy.deepcopy(model)
    memo: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor, param: bool) -> torch.Tensor:
        if id(t) not in memo:
            f = FakeTensor(mode, t.to("meta"), device)
            memo[id(t)] = nn.Parameter(f, requires_grad=t.requires_grad) if param else f
        return memo[id(t)]

    for m in fake.modules():
        for name, p in m._parameters.items():
            if p is not None:
                m._parameters[name] = convert(p, True)
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = convert(b, False)
    return fake


def model_shape(model: nn.Module, blocks: Iterable[type[nn.Module]] | None) -> ModelShape:
    """The shape of `model` (any device, meta included) with every module of a `blocks` type its own FSDP unit."""
    from minidist.fsdp.api import build_units, wrap_predicate

    return ModelShape.from_units(model, build_units(model, wrap_predicate(set(blocks) if blocks else None)))


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def profile_step(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable[[nn.Module, list], torch.Tensor],
                 wrap: Iterable[type[nn.Module]] | None, device: str | torch.device = "cpu") -> StepProfile:
    """Forward and backward of `model` (on the meta device) on `batch` (meta tensors), on fake tensors."""
    from minidist.fsdp.api import build_units, wrap_predicate

    mode = FakeTensorMode()
    fake = _fake_copy(model, mode, torch.device(device))
    units = build_units(fake, wrap_predicate(wrap))
    unit_params = [[info.param for info in infos] for _, _, infos in units]
    params = list(fake.parameters())
    prof = StepProfile(ModelShape.from_units(fake, units))
    backward = [False]  # set once the forward is done
    ledger = MemoryLedger(lambda: {"parameters": params, "gradients": [p.grad for p in params]},
                          observer=lambda led: _observe(led, prof, unit_params, backward))
    stack = [0]
    prof.segments.append(0)
    ledger.tag = 0

    def enter(i: int) -> None:
        stack.append(i)
        prof.segments.append(i)
        ledger.tag = len(prof.segments) - 1

    def leave() -> None:
        stack.pop()
        prof.segments.append(stack[-1])
        ledger.tag = len(prof.segments) - 1

    for i, (_, module, _) in enumerate(units[1:], start=1):
        module.register_forward_pre_hook(lambda *_a, i=i: enter(i))
        module.register_forward_hook(lambda *_a: leave())
    with mode:
        inputs = [FakeTensor(mode, t.to("meta"), torch.device(device)) for t in batch]
        with ledger:
            loss = loss_fn(fake, inputs)
            backward[0] = True
            loss.backward()
    return prof


def _observe(ledger: MemoryLedger, prof: StepProfile, unit_params: list[list[torch.Tensor]],
             backward: list[bool]) -> None:
    snap = ledger.classify()
    back = backward[0]
    seg = ledger.unpacked_tag if back and ledger.unpacked_tag is not None else ledger.tag
    grads = tuple(sum(_nbytes(p.grad) for p in ps) for ps in unit_params)
    prof.samples.append(Sample(back, seg, snap.by_role["activations"], snap.by_role["other"], grads))
