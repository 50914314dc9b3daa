"""Schedules as data: for each rank of the pipeline, the list of actions it runs, in order.

    sched = one_f_one_b(pp=4, microbatches=8)
    sched.actions[1]          # rank 1's list: RECV_F(1,0) F(1,0) SEND_F(1,0) RECV_F(1,1) ...
    print(sched.table())      # the compute actions, one row per rank: what a timeline draws

A schedule says nothing about tensors: it is the order of work, which minidist.pp.check
proves sound before anything runs and minidist.pp.runtime walks. Stage s of the S = pp x v
stages lives on rank s mod pp (with v > 1 each rank holds v stages, "virtual stages" or
chunks, looped: rank 0 holds stages 0, pp, 2 pp, ...). One action is one micro-batch i at
one stage s:

    F       forward of micro-batch i through stage s
    B       its whole backward: the gradient of the stage's input and of its parameters
    BI, BW  the backward in two halves (zero-bubble schedules): BI the input gradient, which
            the previous stage waits for; BW the parameters' gradients, which nobody waits for
            and which can therefore fill a bubble
    SEND_F  after F(s, i): the output of stage s to stage s + 1's rank
    RECV_F  before F(s, i): the output of stage s - 1, from its rank
    SEND_B  after B or BI (s, i): the gradient of stage s's input to stage s - 1's rank
    RECV_B  before B or BI (s, i): the gradient of stage s's output, from stage s + 1's rank

Builders write the compute order of each rank; `with_communication` adds a SEND after each
action whose result another rank needs and a RECV before each action that needs one (two
stages on the same rank hand over in memory). Consecutive SEND/RECV actions form one batch
of batch_isend_irecv in the runtime: 1F1B's "send this activation, receive that gradient"
is one batch, as in torch.distributed.pipelining.

Bubble of each (p ranks, m micro-batches, minidist.pp.cost): GPipe and 1F1B
(p-1)/(m+p-1); interleaved 1F1B with v stages per rank (p-1)/(v m+p-1); ZB-H1 with
forward, input- and weight-backward of equal cost (p-1)/(3m+p-1). What they differ in is
memory: activations held at once per rank (Schedule.in_flight, counted by check.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, NamedTuple


class Kind(enum.Enum):
    F = "F"
    B = "B"
    BI = "BI"
    BW = "BW"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    @property
    def is_comm(self) -> bool:
        return self in COMM


COMM = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
BACKWARD_INPUT = frozenset({Kind.B, Kind.BI})
"""The actions that produce a stage's input gradient."""


class Action(NamedTuple):
    kind: Kind
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind.value}({self.stage},{self.microbatch})"


@dataclass(frozen=True)
class Schedule:
    """Who runs what, in which order: `actions[r]` is rank r's list (compute and communication)."""

    name: str
    pp: int
    microbatches: int
    virtual: int
    """Stages per rank (1 but for interleaved schedules)."""
    actions: tuple[tuple[Action, ...], ...]
    in_flight: tuple[int, ...]
    """Per rank, the most micro-batch activations of its stages it may hold at once (F run, backward
    not finished): the builder's claim, which check.py counts. GPipe m, 1F1B at most p."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual

    @property
    def splits_backward(self) -> bool:
        """Whether weight gradients run as actions of their own (BW), after the backward that ends
        (zero-bubble schedules): an engine that reduces when a backward ends must then wait (compose.deferred)."""
        return any(a.kind is Kind.BW for acts in self.actions for a in acts)

    def rank_of(self, stage: int) -> int:
        return stage % self.pp

    def stages_of(self, rank: int) -> list[int]:
        return stages_of(rank, self.pp, self.virtual)

    def compute(self, rank: int) -> list[Action]:
        """Rank `rank`'s compute actions in order (its communication left out)."""
        return [a for a in self.actions[rank] if not a.kind.is_comm]

    def label(self, action: Action) -> str:
        """F3 (micro-batch 3), or F3c1 (of the rank's chunk 1) where ranks hold several stages."""
        chunk = f"c{action.stage // self.pp}" if self.virtual > 1 else ""
        return f"{action.kind.value}{action.microbatch}{chunk}"

    def table(self) -> str:
        """One row per rank: its compute actions in order, as the timeline draws them."""
        return "\n".join(f"rank {r}: " + " ".join(self.label(a) for a in self.compute(r)) for r in range(self.pp))


def stages_of(rank: int, pp: int, virtual: int = 1) -> list[int]:
    """The stages rank `rank` holds: rank, rank + pp, ... (v of them, looped placement)."""
    return [rank + k * pp for k in range(virtual)]


# ------------------------------------------------------------------------- the builders
def gpipe(pp: int, microbatches: int) -> Schedule:
    """GPipe: every forward, then every backward. Holds all m micro-batches' activations."""
    _check_sizes("gpipe", pp, microbatches)
    orders = [[Action(Kind.F, r, i) for i in range(microbatches)] + [Action(Kind.B, r, i) for i in range(microbatches)]
              for r in range(pp)]
    return with_communication("gpipe", pp, microbatches, 1, orders, [microbatches] * pp)


def one_f_one_b(pp: int, microbatches: int) -> Schedule:
    """1F1B: rank r runs p-1-r forwards ahead (warm-up), then alternates one forward and one backward,
    then drains its backwards. The same bubble as GPipe, but at most p - r activations held (any m:
    with m < p - 1 - r the warm-up is all of them)."""
    _check_sizes("1f1b", pp, microbatches)
    orders = []
    for r in range(pp):
        warm = min(microbatches, pp - 1 - r)
        order = [Action(Kind.F, r, i) for i in range(warm)]
        for i in range(microbatches - warm):
            order += [Action(Kind.F, r, warm + i), Action(Kind.B, r, i)]
        order += [Action(Kind.B, r, i) for i in range(microbatches - warm, microbatches)]
        orders.append(order)
    return with_communication("1f1b", pp, microbatches, 1, orders, [min(microbatches, pp - r) for r in range(pp)])


def interleaved_1f1b(pp: int, microbatches: int, virtual: int = 2) -> Schedule:
    """Interleaved 1F1B (Megatron-LM): v stages per rank, each 1/v of the layers, so the pipeline fills in
    1/v of the time: bubble (p-1)/(v m + p-1), for v times the messages.

    Micro-batches go in groups of p: the group through chunk 0, then through chunk 1, ... (depth
    first); backwards the same groups through the chunks in reverse. Rank r warms up with
    (v-1) p + 2 (p-1-r) forwards, then alternates. m must be a multiple of p (a group smaller
    than p would reach chunk 1 before the pipeline has brought its first micro-batch back round).
    """
    _check_sizes("interleaved_1f1b", pp, microbatches)
    if virtual < 2:
        raise ValueError(f"interleaved_1f1b: virtual={virtual} stages per rank; use 2 or more (1 is 1f1b)")
    if microbatches % pp:
        raise ValueError(f"interleaved_1f1b: microbatches={microbatches} must be a multiple of pp={pp} "
                         f"(micro-batches travel in groups of pp); valid: {pp}, {2 * pp}, {3 * pp}, ...")
    total = microbatches * virtual

    def unit(k: int, backward: bool) -> tuple[int, int]:
        """The k-th forward (or backward) of a rank: (its chunk, the micro-batch)."""
        chunk = (k // pp) % virtual
        return (virtual - 1 - chunk if backward else chunk), (k // (pp * virtual)) * pp + k % pp

    orders, held = [], []
    for r in range(pp):
        warm = min(total, (virtual - 1) * pp + 2 * (pp - 1 - r))
        fwd = [Action(Kind.F, c * pp + r, i) for c, i in (unit(k, False) for k in range(total))]
        bwd = [Action(Kind.B, c * pp + r, i) for c, i in (unit(k, True) for k in range(total))]
        order = fwd[:warm]
        for k in range(total - warm):
            order += [fwd[warm + k], bwd[k]]
        orders.append(order + bwd[total - warm:])
        held.append(min(total, warm + 1))
    return with_communication("interleaved_1f1b", pp, microbatches, virtual, orders, held)


def zb_h1(pp: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al., Zero Bubble Pipeline Parallelism): 1F1B with each backward split into BI and BW.

    Only BI is on the critical path (the previous stage waits for its gradient); rank r defers each
    BW by r micro-batches (BW(i) right after BI(i + r)), so the later ranks, which reach their
    first backward soonest, have weight gradients left to fill the cool-down. With forward, BI and
    BW of equal cost the bubble is (p-1)/(3m+p-1), a third of 1F1B's, for the same p activations.
    """
    _check_sizes("zb_h1", pp, microbatches)
    orders = []
    for r in range(pp):
        warm = min(microbatches, pp - 1 - r)
        order = [Action(Kind.F, r, i) for i in range(warm)]
        weights = []

        def after_backward(i: int) -> None:
            weights.append(Action(Kind.BW, r, i))
            if i >= r:
                order.append(weights.pop(0))
        for i in range(microbatches - warm):
            order += [Action(Kind.F, r, warm + i), Action(Kind.BI, r, i)]
            after_backward(i)
        for i in range(microbatches - warm, microbatches):
            order.append(Action(Kind.BI, r, i))
            after_backward(i)
        orders.append(order + weights)
    return with_communication("zb_h1", pp, microbatches, 1, orders, [min(microbatches, pp) for _ in range(pp)])


BUILDERS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved_1f1b": interleaved_1f1b, "zb_h1": zb_h1}
"""By name (the value of strategy.pp_schedule)."""


def build(name: str, pp: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The schedule `name` (BUILDERS) for pp ranks and m micro-batches; virtual: stages per rank (interleaved)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid: {', '.join(BUILDERS)}")
    if name == "interleaved_1f1b":
        return interleaved_1f1b(pp, microbatches, virtual)
    if virtual != 1:
        raise ValueError(f"{name}: virtual={virtual} stages per rank; only interleaved_1f1b holds more than one")
    return BUILDERS[name](pp, microbatches)


def _check_sizes(name: str, pp: int, microbatches: int) -> None:
    if pp < 1 or microbatches < 1:
        raise ValueError(f"{name}: pp={pp} and microbatches={microbatches} must both be at least 1")


# ------------------------------------------------------------------- adding communication
def with_communication(name: str, pp: int, microbatches: int, virtual: int, orders: list[list[Action]],
                       in_flight: list[int]) -> Schedule:
    """The schedule whose compute order on rank r is orders[r], with its sends and receives added."""
    last = pp * virtual - 1
    actions = []
    for r, order in enumerate(orders):
        out: list[Action] = []
        for a in order:
            s, i = a.stage, a.microbatch
            if a.kind is Kind.F and s > 0 and (s - 1) % pp != r:
                out.append(Action(Kind.RECV_F, s, i))
            if a.kind in BACKWARD_INPUT and s < last and (s + 1) % pp != r:
                out.append(Action(Kind.RECV_B, s, i))
            out.append(a)
            if a.kind is Kind.F and s < last and (s + 1) % pp != r:
                out.append(Action(Kind.SEND_F, s, i))
            if a.kind in BACKWARD_INPUT and s > 0 and (s - 1) % pp != r:
                out.append(Action(Kind.SEND_B, s, i))
        actions.append(tuple(out))
    return Schedule(name, pp, microbatches, virtual, tuple(actions), tuple(in_flight))
