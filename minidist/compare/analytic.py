"""What each strategy must communicate per step, call by call, from the model's shape.

    shape = model_shape(model_on_meta, blocks)                      # minidist.compare.profile
    calls = plan("full_shard", shape, world=8)                      # the strategy's record plans it
    ring_bytes(calls)            # bytes one rank sends: the textbook formulas, summed over the calls

Each strategy's calls are its record's (minidist.strategies: `collectives`, with its closed
form beside it, e.g. ddp's one all_reduce per gradient bucket, 2 S (N-1)/N; full_shard's
(3 S - S_root) (N-1)/N), sized by the model's shape (minidist.shape.ModelShape) and how its
engine moves it (Wire: the buckets as built, the bytes per element reduced and gathered:
fp32 unless a param_dtype / reduce_dtype says otherwise), under the ring model
(minidist.comm.trace.ring_bytes_sent; a broadcast counted as the mean over ranks, S (N-1)/N:
N-1 of the N ranks send S). This module composes them with tensor parallelism.

Tensor-parallel rows (`<strategy>+tp<T>`, minidist.compare.config): T consecutive ranks split
the model (minidist.tp) and share each batch, the strategy runs over the D = N / T data-parallel
ranks (strided by T) on the sliced model, S_T its bytes per rank (about S / T: the embeddings and
norms stay whole unless vocab_parallel). TP's collectives come from minidist.tp.cost, call by
call, for the b x s tokens a tp group shares (width h, L blocks, e bytes per element):

    +tpT             TP's all_reduces (f and g, 4 per block)              8 L b s h e (T-1)/T
                     plus the strategy's calls over D on the slices       + its formula, S_T and D
    sequence_parallel, vocab_parallel: the extra terms of TP_CLOSED_FORM

Context-parallel rows (`<strategy>+cp<C>`): C consecutive ranks share each batch's sequences, each
keeping 1/C of the tokens (minidist.cp), and the strategy runs over all N ranks (dp x cp: its ranks
hold the same weights). The ring's messages come from minidist.cp.cost, call by call, for the b
sequences of s tokens a cp group shares (block = b (s/C) h e, k and v stacked in one message):

    +cpC (ring)          per layer C-1 sends of (k, v) forward, 2 (C-1) backward     6 L b s h e (C-1)/C
    +cpC (all_gather)    per layer one all_gather of (k, v), one reduce_scatter      4 L b s h e (C-1)/C
                         plus the loss's all_reduce over cp (sum and count), and the strategy's calls over N

Pipeline rows (`<strategy>+pp<P>`): P stages on the outermost ranks (stage s on the ranks of pp
coordinate s), each stage's engine over its D = N / P data-parallel ranks on the stage's layers
(S_P: its own buckets and units), reducing once per step (minidist.pp.compose.gradient_sync) but
gathering (FSDP) once per micro-batch. The messages come from the schedule's own action lists
(minidist.pp.schedule), one micro-batch's activation, (b/m) s h e, each:

    +ppP             2 m (b/m) s h e per stage boundary, (S - 1) boundaries over P ranks   2bshe(vP-1)/P
                     plus the tied embedding's gradient between the first and last stage (one
                     send each), the loss's broadcast from the last stage, the clip over pp

TP's calls sit between the layers that need their result: nothing overlaps them (phase
"critical"). With clipping, one scalar all_reduce per set of mesh dimensions that split some
parameter and per dimension of more than one rank (minidist.clip.global_norm);
at D = 1 the engine still issues what its record's one_rank_calls says (nothing moves).

Each call also says when in the step it is issued (phase: forward, backward, after the
backward: ZeRO's parameter exchange without overlap_param_gather, the clip) and so what compute
could hide it (minidist.compare.projection). What the backend really runs, and what the kernel
saw written, come from the trace and from minidist.comm.kernel_io (minidist.compare.analysis),
never from here.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from minidist import strategies
from minidist.comm.trace import ring_bytes_sent
from minidist.shape import ModelShape
from minidist.strategies import Call, Strategy, Wire


TP_CLOSED_FORM = {(False, False): "8Lbshe(T-1)/T", (False, True): "((8L+4)bsh+6bs)e(T-1)/T",
                  (True, False): "((8L+2)bsh+(12L+4)h+sh)e(T-1)/T",
                  (True, True): "((8L+4)bsh+(12L+4)h+sh+6bs)e(T-1)/T"}
"""TP's bytes per rank and step by (sequence_parallel, vocab_parallel), from minidist.tp.cost's inventory."""


CP_CLOSED_FORM = {"ring": "6Lbshe(C-1)/C", "all_gather": "4Lbshe(C-1)/C"}
"""The ring's (or the all_gather variant's) bytes per rank and step, from minidist.cp.cost.BLOCKS."""


def closed_form(strategy: str, tp: "TensorParallel | None" = None, cp: "ContextParallel | None" = None,
                pp: "PipelineParallel | None" = None) -> str:
    """The row's formula: the strategy's; with tensor parallelism TP's term plus the strategy's over S_T and D;
    with context parallelism CP's term plus the strategy's over all N ranks; with a pipeline its messages plus
    the strategy's over a stage's S_P and D."""
    own = strategies.get(strategy).closed_form
    if pp is not None:
        return f"{pp.term} + " + own.replace("S", "S_P").replace("N", "D").replace("S_P_root", "S_root")
    if cp is not None:
        return f"{CP_CLOSED_FORM[cp.rotate]} + {own}"
    if tp is None or tp.size <= 1:
        return own
    dp = own.replace("S", "S_T").replace("N", "D").replace("S_T_root", "S_root")
    return TP_CLOSED_FORM[tp.sequence_parallel, tp.vocab_parallel] + (f" + {dp}" if tp.dp > 1 else "")


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor (what each link carries)."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce


@dataclass(frozen=True)
class TensorParallel:
    """A row's tensor parallelism: T consecutive ranks share each batch (minidist.tp's GPT plan)."""

    size: int
    """T, ranks per tensor-parallel group."""
    dp: int
    """D = N / T, the data-parallel ranks the strategy runs over."""
    collectives: tuple[tuple[str, int, int], ...]
    """(op, elements of the whole tensor, calls) per step: minidist.tp.cost.collectives."""
    itemsize: int = 4
    """Bytes per activation element moved."""
    norm_dims: tuple[tuple[str, ...], ...] = ()
    """The clip's groups: each set of mesh dimensions ("dp", "tp") that splits some parameter."""
    sequence_parallel: bool = False
    vocab_parallel: bool = False

    @classmethod
    def of_gpt(cls, model_cfg, batch: int, seq: int, size: int, dp: int, *, sequence_parallel: bool = False,
               vocab_parallel: bool = False, itemsize: int = 4, norm_dims=()) -> "TensorParallel":
        """The GPT plan's collectives for `batch` sequences of `seq` tokens per tp group."""
        from minidist.tp import cost
        calls = cost.collectives(model_cfg, batch, seq, sequence_parallel=sequence_parallel,
                                 vocab_parallel=vocab_parallel)
        return cls(size, dp, tuple((op, numel, k) for (op, numel), k in sorted(calls.items())), itemsize,
                   tuple(tuple(d) for d in norm_dims), sequence_parallel, vocab_parallel)


@dataclass(frozen=True)
class ContextParallel:
    """A row's context parallelism: C consecutive ranks share each batch's sequences (minidist.cp's GPT plan)."""

    size: int
    """C, ranks per cp group."""
    rotate: str
    """How keys and values travel: "ring" or "all_gather" (strategy.cp_rotate)."""
    n_layer: int
    block: int
    """Bytes of one rank's keys (or values): b (s/C) h e (minidist.cp.cost.block_bytes)."""

    @classmethod
    def of_gpt(cls, model_cfg, batch: int, seq: int, size: int, rotate: str, itemsize: int = 4) -> "ContextParallel":
        """The GPT's attention over `batch` sequences of `seq` tokens per cp group."""
        from minidist.cp import cost
        return cls(size, rotate, model_cfg.n_layer, cost.block_bytes(batch, seq, model_cfg.n_embd, size, itemsize))

    def calls(self) -> list[Call]:
        """Every message of one step per rank, as minidist.comm.trace records them (k and v in one message;
        a receive sends nothing); nothing hides them: the layer's attention waits for the last block."""
        from minidist.cp import cost
        c, kv = self.size, 2 * self.block
        if self.rotate == "ring":  # forward C-1 hops of (k, v); backward the same tour plus (dk, dv) home
            hop = [Call("send", kv, c, phase="critical"), Call("recv", kv, c, phase="critical")]
            per_layer = hop * (3 * (c - 1))
        else:
            per_layer = [Call("all_gather", c * kv, c, phase="critical"),
                         Call("reduce_scatter", c * kv, c, phase="critical")]
        return per_layer * self.n_layer + [Call("all_reduce", cost.LOSS_BYTES, c, phase="forward")]  # the loss's mean


@dataclass(frozen=True)
class PipelineParallel:
    """A row's pipeline: P stages on the outermost ranks, each stage's engine over D = N / P data-parallel ranks."""

    size: int
    """P, stages' ranks in one pipeline."""
    dp: int
    """D = N / P, the ranks holding the same stage (each stage's engine spans them)."""
    schedule: str
    microbatches: int
    virtual: int
    message: int
    """Bytes of one micro-batch's activation (or its gradient) at a stage boundary: (b/m) s h e."""

    @classmethod
    def of_gpt(cls, model_cfg, batch: int, seq: int, size: int, dp: int, schedule: str, microbatches: int,
               virtual: int = 1, itemsize: int = 4) -> "PipelineParallel":
        """The GPT's pipeline for `batch` sequences of `seq` tokens per pipeline, in m micro-batches."""
        return cls(size, dp, schedule, microbatches, virtual, batch // microbatches * seq * model_cfg.n_embd * itemsize)

    @property
    def span(self) -> int:
        """Ranks a pipeline stretches over: its stages are D ranks apart (pp is the outermost dimension)."""
        return self.size * self.dp

    def p2p(self, rank: int) -> list[Call]:
        """Pipeline rank `rank`'s messages of one step, one per SEND or RECV of its action list (a receive sends
        nothing); phase "pipeline": the schedule's fill and drain wait for them (minidist.compare.projection)."""
        from minidist.pp import build
        kinds = [a.kind.value for a in build(self.schedule, self.size, self.microbatches, self.virtual).actions[rank]]
        return [Call("send" if k.startswith("SEND") else "recv", self.message, self.size, span=self.span,
                     phase="pipeline") for k in kinds if k.startswith(("SEND", "RECV"))]

    @property
    def term(self) -> str:
        """Its bytes per rank and step in closed form (minidist.pp.cost.step_bytes: S - 1 = vP - 1 boundaries over
        P ranks), b the sequences a pipeline shares."""
        return "2bshe(P-1)/P" if self.virtual == 1 else "2bshe(vP-1)/P"

    def bubble(self) -> float:
        """The share of the step each rank waits, by formula (minidist.pp.cost.bubble)."""
        from minidist.pp import cost
        return cost.bubble(self.schedule, self.size, self.microbatches, self.virtual)


def pipeline_calls(record: Strategy, stages: list[tuple[ModelShape, Wire]], pp: PipelineParallel, rank: int, *,
                   group: int | None = None, tie: int = 0, norm_dims=(), grad_clip: bool = True) -> list[Call]:
    """Every call of one step on pipeline rank `rank` holding `stages` (each stage's shape and wire): each stage's
    engine over D (its gathers once per micro-batch: every micro-batch's forward and backward gathers again; its
    reductions once), the schedule's messages, the tied weight's gradient to its twin (`tie` bytes, one send and
    one receive; 0: no twin on another rank), the loss's broadcast over pp, the clip's scalars (one all_reduce
    per dimension of more than one rank in each of `norm_dims`, as minidist.clip.global_norm issues them)."""
    calls = []
    for shape, wire in stages:
        engine = plan(record, shape, pp.dp, wire, group=group, grad_clip=False)
        if pp.dp == 1:  # a data-parallel group of one rank: what the engine still calls on it (nothing moves)
            engine = [Call(op, x * wire.reduce_bytes(shape), 1) for x in wire.buckets(shape)
                      for op in record.one_rank_calls]
        calls += [c for c in engine for _ in range(pp.microbatches if c.op == "all_gather" else 1)]
    calls += pp.p2p(rank)
    if tie:
        calls += [Call(op, tie, pp.size, span=pp.span, phase="after") for op in ("send", "recv")]
    calls.append(Call("broadcast", 4, pp.size, span=pp.span, phase="after"))  # the loss, from the last stage
    sizes = {"pp": pp.size, "dp": pp.dp}
    if grad_clip:
        calls += [Call("all_reduce", 4, sizes[d], phase="after") for dims in norm_dims for d in dims if sizes[d] > 1]
    return calls


def _tensor_parallel(record: Strategy, shape: ModelShape, wire: Wire, world: int, tp: TensorParallel,
                     grad_clip: bool) -> list[Call]:
    """TP's calls inside each group of T consecutive ranks, the strategy's over D = N / T strided ones, the clip."""
    t, d = tp.size, tp.dp
    if t * d != world:
        raise ValueError(f"tp {t} x dp {d} is not the world {world}")
    calls = [Call(op, numel * tp.itemsize, t, phase="critical") for op, numel, k in tp.collectives for _ in range(k)]
    calls += [dataclasses.replace(c, span=c.ranks_spanned * t) for c in plan(record, shape, d, wire, grad_clip=False)]
    if d == 1:  # a data-parallel group of one rank: what the engine still calls on it (nothing moves)
        calls += [Call(op, x * wire.reduce_bytes(shape), 1) for x in wire.buckets(shape)
                  for op in record.one_rank_calls]
    sizes = {"tp": t, "dp": d}
    if grad_clip:
        calls += [Call("all_reduce", 4, sizes[dim], span=t if dim == "tp" else world, phase="after")
                  for dims in tp.norm_dims for dim in dims if sizes[dim] > 1]
    return calls


def plan(strategy: str | Strategy, shape: ModelShape, world: int, wire: Wire = Wire(), *, group: int | None = None,
         grad_clip: bool = True, tp: TensorParallel | None = None) -> list[Call]:
    """Every collective one step of `strategy` (a name or a record) issues, per rank, at `world` ranks.

    group: the ranks its states are sharded over (hybrid_shard's shard group; default: its record's
    state_group with the processes per node unknown, i.e. the world); with `tp`: a tensor-parallel
    row, `shape` the sliced model's."""
    record = strategies.get(strategy) if isinstance(strategy, str) else strategy
    if tp is not None and tp.size > 1:
        return _tensor_parallel(record, shape, wire, world, tp, grad_clip)
    if world <= 1:
        return []
    group = group or _preset_group(record, world)
    return record.collectives(shape, wire, world, group, grad_clip)


@functools.lru_cache(maxsize=None)
def _preset_group(record: Strategy, world: int) -> int:
    """The record's state group at its preset, processes per node unknown: composing a preset (OmegaConf) costs
    ~3 ms, and the planner asks this of thousands of layouts."""
    return record.state_group(record.preset(), world, None)


def ring_bytes(calls: list[Call]) -> int:
    """Bytes one rank sends for `calls` under the ring model, as the trace counts them."""
    return sum(ring_bytes_sent(c.op, c.payload, c.group_size) for c in calls)


def calls_by_op(calls: list[Call]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in calls:
        out[c.op] = out.get(c.op, 0) + 1
    return out
