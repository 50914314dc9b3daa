"""The runtime: walk this rank's action list, computing and exchanging tensors with batched isend/irecv.

    pipe = Pipeline(stages, schedule, mesh["pp"], loss_fn=cut.loss_fn, ties=cut.ties)
    loss = pipe.step(x, target=y)     # every rank of the pipeline passes the same batch;
                                      # the loss comes back on the last stage's rank (None elsewhere)
    optimizer.step()                  # the gradients of this rank's stages are in p.grad

One step, on each rank, in the order of its list (minidist.pp.schedule):

  F(s, i)    run stage s on micro-batch i (the first stage: the batch's piece; otherwise the
             tensor received, or the previous stage's output when it is on this rank); the last
             stage also computes loss_fn(output, target_i) / m (minidist.pp.microbatch)
  B(s, i)    backward from that output, fed the gradient received (the last stage: the loss)
  BI, BW     the same backward in two halves (minidist.pp.backward)
  a run of SEND/RECV   one batch_isend_irecv (minidist.comm.p2p), then a wait for the previous
             batch's sends (a gloo send completes when its receive is posted; waiting there frees
             the sent tensor before the next micro-batch, not at the end of the step) and for this
             batch's receives. That is the blocking order minidist.pp.check simulated, so a schedule
             that passed the check cannot hang here.

Shapes: a receiver must allocate its buffer before the tensor arrives. The first message across
each boundary carries a small header (dtype and shape) first; later ones reuse it. The headers
are sent again after the batch's shape changes, which every rank sees because every rank is
given the batch. A gradient needs no header: it has the shape of the output this rank computed.

After the last action: the sends are waited for, weights shared by two stages on different
ranks get their gradients summed (minidist.pp.compose.sync_ties), an engine whose reduction was
deferred to here reduces (Pipeline.defer: ZeRO's, minidist.pp.compose.deferred), and `timeline` holds what
this rank did when (compute actions and waits for receives, perf_counter seconds): the picture
of a schedule is drawn from it, not from the action list.

Topology is explicit: the pipeline spans the 1-D mesh it is given (mesh["pp"] of a larger
layout); peers are ranks of that group, stage s on rank s mod pp.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.pp import compose, microbatch
from minidist.pp.backward import PendingWeights, backward_input, backward_weight
from minidist.pp.check import check, message
from minidist.pp.schedule import Action, Kind, Schedule
from minidist.pp.stage import Stage, Tie

TAG = 0x5050
"""Pipeline messages' tag: never matched with another user's point-to-point traffic (gloo honours tags)."""
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32)
HEADER = 10
"""Header elements: dtype code, number of dims, up to 8 sizes."""


class StepState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    FAILED = "failed"
    """A step raised midway: other ranks may be inside it; build a new Pipeline (and process group)."""


@dataclass
class _Step:
    """One step's tensors, by (stage, micro-batch)."""

    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    received: dict[tuple, torch.Tensor] = field(default_factory=dict)
    stage_input: dict[tuple, torch.Tensor] = field(default_factory=dict)
    output: dict[tuple, torch.Tensor] = field(default_factory=dict)
    pending: dict[tuple, PendingWeights] = field(default_factory=dict)
    losses: list[torch.Tensor] = field(default_factory=list)
    sends: list = field(default_factory=list)


class Pipeline:
    """Runs `schedule` over the 1-D mesh `device_mesh` with this rank's `stages` (its schedule.stages_of)."""

    def __init__(self, stages: Sequence[Stage], schedule: Schedule, device_mesh: DeviceMesh,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *, ties: Sequence[Tie] = ()):
        if device_mesh.ndim != 1:
            raise ValueError(f"Pipeline spans one mesh dimension; got dimensions {device_mesh.mesh_dim_names}: "
                             f"pass mesh['pp']")
        self.group, self.rank = device_mesh.get_group(), device_mesh.get_local_rank()
        if device_mesh.size() != schedule.pp:
            raise ValueError(f"schedule {schedule.name} is for pp={schedule.pp} ranks; "
                             f"the mesh has {device_mesh.size()}")
        check(schedule)
        held = sorted(s.index for s in stages)
        if held != schedule.stages_of(self.rank) or any(s.num_stages != schedule.num_stages for s in stages):
            raise ValueError(f"rank {self.rank} of the pipeline must hold stages {schedule.stages_of(self.rank)} of "
                             f"{schedule.num_stages}; it was given {held}")
        self.schedule, self.loss_fn, self.ties = schedule, loss_fn, tuple(ties)
        self.stages = {s.index: s for s in stages}
        self.device = next((p.device for s in stages for p in s.module.parameters()), torch.device("cpu"))
        self._program = _batches(schedule, self.rank)
        self._last_backward = {a.stage: k for k, a in enumerate(self._program)
                               if isinstance(a, Action) and a.kind in (Kind.B, Kind.BW)}
        self._shapes: dict[int, tuple[torch.Size, torch.dtype]] = {}
        self._signature: tuple | None = None
        self._deferred: compose.Deferred | None = None
        self.state = StepState.IDLE
        self.timeline: list[tuple[str, float, float]] = []
        """The last step's (what, start, end): compute labels as Schedule.label, "wait" for receives."""

    def defer(self, reduction: compose.Deferred) -> None:
        """Reduce the gradients once after the schedule, not in a backward (minidist.pp.compose.deferred):
        every stage's backwards run in reduction.sync, the ties are summed on the local gradients, then
        reduction.reduce(). Before the first step, on every rank."""
        assert self.state is StepState.IDLE and self._signature is None, "defer() before the first step"
        self._deferred = reduction
        for stage in self.stages.values():
            stage.sync = reduction.sync

    # ---------------------------------------------------------------------- the step
    def step(self, *inputs: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor | None:
        """One forward and backward of the batch (`inputs` for the first stage, `target` for the loss)."""
        assert self.state is StepState.IDLE, f"a pipeline step is {self.state.value}; build a new Pipeline"
        if len(inputs) != 1 or target is None:
            raise ValueError("Pipeline.step(x, target=y): every rank of the pipeline passes the batch and its targets")
        m = self.schedule.microbatches
        signature = (inputs[0].shape, inputs[0].dtype, target.shape)
        if signature != self._signature:
            self._shapes, self._signature = {}, signature  # every rank resets: headers go out again
        st = _Step(microbatch.split(inputs[0], m), microbatch.split(target, m, "target"))
        self.state, self.timeline = StepState.RUNNING, []
        try:
            for k, item in enumerate(self._program):
                if isinstance(item, Action):
                    self._timed(self.schedule.label(item), self._compute, st, item, k)
                else:
                    self._communicate(st, item)
            for work in st.sends:
                work.wait()
            grad_of = self._deferred.grad_of if self._deferred else compose.plain_grad
            compose.sync_ties(self.ties, self.stages, self.schedule, self.group, self.rank, grad_of)
            if self._deferred:
                self._deferred.reduce()
        except BaseException:
            self.state = StepState.FAILED
            raise
        self.state = StepState.IDLE
        return torch.stack(st.losses).mean() if st.losses else None

    def _timed(self, what: str, fn, *args) -> None:
        start = time.perf_counter()
        fn(*args)
        self.timeline.append((what, start, time.perf_counter()))

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters of this rank's stages (under FSDP, its shards), for the optimizer."""
        return [p for s in sorted(self.stages) for p in self.stages[s].module.parameters()]

    # ---------------------------------------------------------------------- compute
    def _compute(self, st: _Step, a: Action, position: int) -> None:
        stage, key = self.stages[a.stage], (a.stage, a.microbatch)
        if a.kind is Kind.F:
            x = self._input_of(st, a)
            st.stage_input[key] = x
            out = stage(x)
            if stage.is_last:
                loss = self.loss_fn(out, st.targets[a.microbatch])
                st.losses.append(loss.detach())
                out = loss * microbatch.scale(self.schedule.microbatches)
            st.output[key] = out
            return
        last = self._last_backward[a.stage] == position
        sync = stage.sync or compose.no_engine
        if a.kind is Kind.BW:
            with sync(last):
                backward_weight(st.pending.pop(key))
            return
        grad = None if stage.is_last else self._output_grad(st, a)
        out = st.output.pop(key)
        x = st.stage_input.pop(key) if stage.is_first else st.stage_input[key]  # the rest: its .grad goes on
        if a.kind is Kind.B:
            with sync(last):
                torch.autograd.backward(out, grad)
        else:
            with sync(False):
                st.pending[key] = backward_input(out, grad, x, list(stage.module.parameters()))

    def _input_of(self, st: _Step, a: Action) -> torch.Tensor:
        if a.stage == 0:
            return st.inputs[a.microbatch]
        x = st.received.pop(("activation", a.stage - 1, a.microbatch), None)
        if x is None:  # the previous stage is on this rank: its output, cut from its graph
            x = st.output[(a.stage - 1, a.microbatch)].detach()
        return x.requires_grad_(x.is_floating_point())

    def _output_grad(self, st: _Step, a: Action) -> torch.Tensor:
        grad = st.received.pop(("gradient", a.stage, a.microbatch), None)
        if grad is None:  # the next stage is on this rank
            grad = st.stage_input.pop((a.stage + 1, a.microbatch)).grad
        return grad

    # ---------------------------------------------------------------------- communication
    def _communicate(self, st: _Step, batch: list[tuple]) -> None:
        """Post the batch (headers first where a boundary's shape is new); wait for the previous batch's
        sends (gloo's complete once received: the sent tensors are freed here) and this batch's receives."""
        previous, st.sends = st.sends, []
        ops, recvs = [], []
        for a, src, dst, what in batch:
            if a.kind in (Kind.SEND_F, Kind.SEND_B):
                tensor = self._outgoing(st, a)
                if what[0] == "activation" and what[1] not in self._shapes:
                    self._shapes[what[1]] = (tensor.shape, tensor.dtype)
                    ops.append(self._op(comm.isend, _header(tensor), dst))
                ops.append(self._op(comm.isend, tensor, dst))
            else:
                recvs.append((a, src, what))
        needs_header = any(w[0] == "activation" and w[1] not in self._shapes for _, _, w in recvs)
        if needs_header:  # a new shape: the sends go now, each receive is posted once its header came
            st.sends += comm.batch_isend_irecv(ops)
            ops = []
        works = []
        for a, src, what in recvs:
            st.received[what] = buffer = self._buffer(st, a, src, what)
            op = self._op(comm.irecv, buffer, src)
            if needs_header:
                works += comm.batch_isend_irecv([op])  # posted before the next header's receive: same order
            else:
                ops.append(op)
        if not needs_header:
            posted = comm.batch_isend_irecv(ops)
            st.sends += posted[:len(ops) - len(recvs)]
            works = posted[len(ops) - len(recvs):]
        start = time.perf_counter()
        for work in previous:
            work.wait()
        for (a, src, _), work in zip(recvs, works):
            self._wait(work, a, src)
        self.timeline.append(("wait", start, time.perf_counter()))

    def _op(self, op, tensor: torch.Tensor, peer: int) -> comm.P2POp:
        return comm.P2POp(op, tensor, peer, self.group, TAG)

    def _outgoing(self, st: _Step, a: Action) -> torch.Tensor:
        key = (a.stage, a.microbatch)
        tensor = st.output[key] if a.kind is Kind.SEND_F else st.stage_input.pop(key).grad
        return tensor.detach().contiguous()

    def _buffer(self, st: _Step, a: Action, src: int, what: tuple) -> torch.Tensor:
        if what[0] == "gradient":  # shaped like the output this rank computed
            out = st.output[(a.stage, a.microbatch)]
            return torch.empty_like(out, memory_format=torch.contiguous_format)
        if what[1] not in self._shapes:
            header = torch.zeros(HEADER, dtype=torch.int64)
            self._wait(comm.irecv(header, src, group=self.group, tag=TAG), a, src)
            self._shapes[what[1]] = _unheader(header)
        shape, dtype = self._shapes[what[1]]
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _wait(self, work, a: Action, src: int) -> None:
        try:
            work.wait()
        except RuntimeError as exc:  # gloo's timeout names no tensor: say which message never came
            raise RuntimeError(f"pipeline rank {self.rank} ({self.schedule.name}): {a} from rank {src} did not "
                               f"arrive ({exc})") from exc


def _batches(schedule: Schedule, rank: int) -> list:
    """Rank `rank`'s list with each run of consecutive SEND/RECV actions gathered into one batch, each
    message with its (sender, receiver, what) worked out once (minidist.pp.check.message)."""
    out: list = []
    for a in schedule.actions[rank]:
        if a.kind.is_comm:
            if not out or not isinstance(out[-1], list):
                out.append([])
            out[-1].append((a, *message(schedule, a)))
        else:
            out.append(a)
    return out


def _header(t: torch.Tensor) -> torch.Tensor:
    if t.dtype not in DTYPES or t.dim() > HEADER - 2:
        raise ValueError(f"a pipeline stage's output must be a tensor of at most {HEADER - 2} dims of "
                         f"{', '.join(map(str, DTYPES))}; got {t.dtype} of {t.dim()} dims")
    return torch.tensor([DTYPES.index(t.dtype), t.dim(), *t.shape] + [0] * (HEADER - 2 - t.dim()), dtype=torch.int64)


def _unheader(h: torch.Tensor) -> tuple[torch.Size, torch.dtype]:
    code, ndim = int(h[0]), int(h[1])
    return torch.Size(int(d) for d in h[2:2 + ndim]), DTYPES[code]
