"""What an engine holds in memory on one rank, instant by instant of a training step.

The interface an engine module offers so that a memory estimate (minidist.compare.estimate)
adds what the engine holds to a profile of the plain model's step without re-encoding the
engine's schedule, and so that a measurement (minidist.compare.memory) can name the engine's
tensors without touching them:

    held(shape, world, ...settings) -> list[Held]       # from sizes (minidist.shape) and settings; nothing runs
    live(engine_object) -> dict[role, list[Tensor]]      # its tensors that exist now, read only

Each engine implements it beside its own code, so whoever changes a schedule sees what to keep
true: minidist/ddp/footprint.py (DDP), minidist/zero/footprint.py (the paper's ZeRO-1 and
ZeRO-2, and the owner-broadcast variant), minidist/fsdp/footprint.py (FSDP's strategies).
tests/compare/test_measure.py compares every estimate built from them with torch's allocator
events, so a stale one fails there.

An instant (At) is named the way a profile of the plain model can find it: the phase, and
the FSDP unit running (unit 0 is the root; units 1.. the wrapped blocks in forward order):

    forward, u          inside unit u's forward
    backward, u         inside unit u's backward, its gradients accumulating
    post_backward, u    when u's last gradient is computed (what an engine does then)
    optimizer           the optimizer step and what follows it (no activations left)

`stage` orders several instants of one phase and unit (e.g. the optimizer's update, then
the owner-broadcast variant's broadcasts). unit None covers every unit of its phase; an engine lists each instant
its holdings change at.

Held.bytes is what the engine holds then, by role; the plain model's gradients are not in it:
Held.plain_grads names the units whose gradients (as the plain model computes them; the
estimator reads those bytes from the profile, which knows how far backward has got) are alive
then: DDP keeps them all, FSDP drops a unit's once it has reduced them. Held.before_grads, for a
backward instant, is what the engine holds until the unit's first gradient of this backward
exists (ZeRO-2 allocates a bucket's buffer with its first gradient; the peak of a step is
often just before: the last forward's activations are all still alive).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("parameters", "gradients", "optimizer", "buffers", "activations", "other")
"""The columns of a memory breakdown, in the order reports print them."""

PHASES = ("forward", "backward", "post_backward", "optimizer")


@dataclass(frozen=True)
class At:
    phase: str
    unit: int | None = None
    stage: int = 0

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"unknown phase {self.phase!r}; one of {', '.join(PHASES)}")


@dataclass(frozen=True)
class Held:
    at: At
    bytes: dict[str, int] = field(default_factory=dict)
    """Role -> bytes the engine holds at this instant (parameters, gradients, optimizer, buffers, other)."""
    plain_grads: tuple[int, ...] | None = None
    """Units whose plain-model gradients are alive now; None = every unit's."""
    note: str = ""
    """What this instant is, in words (reports show it where the peak falls)."""
    before_grads: dict[str, int] | None = None
    """Backward: the bytes held while at.unit has no gradient yet in this backward (None: `bytes`)."""
    in_flight: int = 0
    """Of `bytes`, what exists only while a collective is still running (a backend's staging of it):
    a measured peak at this instant holds it or not as the collective's timing falls."""


@dataclass(frozen=True)
class OptimizerModel:
    """torch's optimizer as it runs on one rank: its state per element and the temporaries of step().

    AdamW keeps two moments per element (K = 2 x itemsize bytes; 8 for fp32) and a 4-byte step
    counter per tensor; SGD with momentum one buffer. step() on the CPU runs one tensor at a
    time (torch's single-tensor path): AdamW allocates about two temporaries of the tensor
    being updated, so the largest piece sets them. On an accelerator it runs the foreach path:
    about one temporary the size of everything it updates.
    """

    name: str = "adamw"
    device_type: str = "cpu"

    @property
    def state_tensors(self) -> int:
        return {"adamw": 2, "sgd": 1}[self.name]

    def state_bytes(self, pieces: list[int], itemsize: int) -> int:
        counters = 4 * len(pieces) if self.name == "adamw" else 0
        return self.state_tensors * itemsize * sum(pieces) + counters

    def temporaries(self, pieces: list[int], itemsize: int) -> int:
        if not pieces or self.name != "adamw":
            return 0
        return (2 * max(pieces) if self.device_type == "cpu" else sum(pieces)) * itemsize
