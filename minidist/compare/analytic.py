"""What each strategy must communicate per step, call by call, from the model's structure.

    lay = Layout.from_model(model_on_meta, blocks, bucket_numels)
    calls = plan("full_shard", lay, world=8)
    ring_bytes(calls)            # bytes one rank sends: the textbook formulas, summed over the calls

Per step and rank, S = bytes of the parameters (FSDP: every parameter padded to whole rows per
rank, dim 0, as minidist.fsdp shards it; ZeRO: each bucket padded to a multiple of N), N ranks,
ring model (minidist.comm.trace.ring_bytes_sent; a broadcast counted as the mean over ranks,
S (N-1)/N: N-1 of the N ranks send S):

    ddp              one all_reduce per gradient bucket                   2 S (N-1)/N
    zero1, zero2     per bucket: reduce_scatter (backward), all_gather    2 S (N-1)/N
                     of the updated partitions (after step)
    zero1_broadcast  ddp's, plus one broadcast of each owner's share of   3 S (N-1)/N
                     the updated parameters (what an all_gather would send)
    shard_grad_op    per unit: all_gather (forward), reduce_scatter       2 S (N-1)/N
    full_shard       per unit: all_gather (forward), all_gather (backward, (3 S - S_root) (N-1)/N
                     freed after forward; not the root, kept), reduce_scatter
    hybrid_shard     full_shard in a shard group of G, then an all_reduce  (3 S - S_root) (G-1)/G
                     of each reduced shard across the R = N/G replicas     + 2 (S/G) (R-1)/R
    no_shard         one all_reduce per unit                               2 S (N-1)/N

Tensor-parallel rows (`<strategy>+tp<T>`, minidist.compare.config): T consecutive ranks split
the model (minidist.tp) and share each batch, the strategy runs over the D = N / T data-parallel
ranks (strided by T) on the sliced model, S_T its bytes per rank (about S / T: the embeddings and
norms stay whole unless vocab_parallel). TP's collectives come from minidist.tp.cost, call by
call, for the b x s tokens a tp group shares (width h, L blocks, e bytes per element):

    +tpT             TP's all_reduces (f and g, 4 per block)              8 L b s h e (T-1)/T
                     plus the strategy's calls over D on the slices       + its formula, S_T and D
    sequence_parallel, vocab_parallel: the extra terms of TP_CLOSED_FORM

TP's calls sit between the layers that need their result: nothing overlaps them (phase
"critical"). With clipping, one scalar all_reduce per set of mesh dimensions that split some
parameter and per dimension of more than one rank (minidist.parallel.placement.global_norm).

plus, for FSDP and the paper's ZeRO (whose gradients are sharded), the gradient-norm all_reduce
of one fp32 scalar when clipping. Each call also says when in the step it is issued (phase:
forward, backward, or after the backward: ZeRO's parameter exchange without
overlap_param_gather, the clip) and so what compute could hide it (minidist.compare.projection),
and is sized in the dtype the engine moves: gathered parameters in param_itemsize, reduced
gradients in itemsize (fp32 unless a param_dtype / reduce_dtype says otherwise).
What the backend really runs, and what the kernel saw written, come from the trace and from
minidist.comm.kernel_io (minidist.compare.analysis), never from here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch.nn as nn

from minidist.comm.trace import ring_bytes_sent
from minidist.zero.footprint import owner_shares

CLOSED_FORM = {"ddp": "2S(N-1)/N", "zero1": "2S(N-1)/N", "zero2": "2S(N-1)/N", "zero1_broadcast": "3S(N-1)/N",
               "shard_grad_op": "2S(N-1)/N",
               "full_shard": "(3S-S_root)(N-1)/N", "hybrid_shard": "(3S-S_root)(G-1)/G + 2(S/G)(R-1)/R",
               "no_shard": "2S(N-1)/N", "single": "0"}


TP_CLOSED_FORM = {(False, False): "8Lbshe(T-1)/T", (False, True): "((8L+4)bsh+6bs)e(T-1)/T",
                  (True, False): "((8L+2)bsh+(12L+4)h+sh)e(T-1)/T",
                  (True, True): "((8L+4)bsh+(12L+4)h+sh+6bs)e(T-1)/T"}
"""TP's bytes per rank and step by (sequence_parallel, vocab_parallel), from minidist.tp.cost's inventory."""


def closed_form(strategy: str, tp: "TensorParallel | None" = None) -> str:
    """The row's formula: the strategy's; with tensor parallelism TP's term plus the strategy's over S_T and D."""
    if tp is None or tp.size <= 1:
        return CLOSED_FORM.get(strategy, "")
    dp = CLOSED_FORM.get(strategy, "").replace("S", "S_T").replace("N", "D").replace("S_T_root", "S_root")
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
class Call:
    op: str
    payload: int
    """S of this call: bytes of the full logical tensor (as minidist.comm.trace records it)."""
    group_size: int
    span: int = 0
    """Consecutive ranks the group stretches over (0 = group_size): a replica group of
    hybrid_shard holds one rank in every G, so it spans every node."""
    phase: str = "backward"
    """When it is issued: forward, backward, after (the backward's end: nothing left to hide it), or
    critical (tensor parallelism's: the next layer waits for it, nothing can hide it)."""

    @property
    def ranks_spanned(self) -> int:
        return self.span or self.group_size


@dataclass(frozen=True)
class Layout:
    """The sizes a strategy's collectives are made of (elements), and the bytes per element moved."""

    param_numels: tuple[int, ...]
    """Every parameter once (the owner-broadcast variant partitions them by numel)."""
    unit_numels: tuple[int, ...]
    """FSDP units, root first (minidist.fsdp's assignment for the wrapped block types)."""
    bucket_numels: tuple[int, ...]
    """The gradient buckets as the engine built them (DDP's reducer; ZeRO's, padded to N)."""
    itemsize: int = 4
    """Bytes per gradient element reduced (and per parameter element where nothing else is said)."""
    even_shares: bool = False
    """zero1_broadcast: N equal shares instead of partitioning param_numels (a model known only by its size)."""
    param_itemsize: int = 0
    """Bytes per parameter element gathered or broadcast (0 = itemsize)."""
    unit_param_rows: tuple[tuple[tuple[int, int], ...], ...] = ()
    """FSDP units' parameters as (rows, elements per row): each is padded to whole rows per rank
    (empty: a model known only by its size, each unit padded as one flat buffer)."""

    @classmethod
    def from_model(cls, model: nn.Module, blocks, bucket_numels=()) -> "Layout":
        from minidist.fsdp.api import build_units, wrap_predicate
        units = [infos for _, _, infos in build_units(model, wrap_predicate(set(blocks)))]
        units = [infos for infos in units if sum(i.param.numel() for i in infos)]
        rows = tuple(tuple(param_rows(i.param.shape) for i in infos) for infos in units)
        params = tuple(p.numel() for p in model.parameters())
        itemsize = next(model.parameters()).element_size()
        return cls(params, tuple(sum(r * c for r, c in u) for u in rows), tuple(bucket_numels) or (sum(params),),
                   itemsize, unit_param_rows=rows)

    @classmethod
    def uniform(cls, psi: float, layers: int, bucket_cap_bytes: int, itemsize: int = 4,
                param_itemsize: int = 0) -> "Layout":
        """A model of psi parameters in `layers` equal units and parameters, DDP buckets of the cap."""
        per_layer = int(psi // layers)
        per_bucket = max(1, bucket_cap_bytes // itemsize)
        n_buckets = -(-int(psi) // per_bucket)
        return cls((per_layer,) * layers, (per_layer,) * layers, (int(psi) // n_buckets,) * n_buckets, itemsize,
                   even_shares=True, param_itemsize=param_itemsize)

    @property
    def psi(self) -> int:
        return sum(self.param_numels)

    @property
    def gather_itemsize(self) -> int:
        return self.param_itemsize or self.itemsize


ONE_RANK = {"ddp": ("all_reduce",), "zero1_broadcast": ("all_reduce",), "zero1": ("reduce_scatter", "all_gather"),
            "zero2": ("reduce_scatter", "all_gather")}
"""The calls an engine still issues per bucket over a data-parallel group of one rank (pure TP, D = 1):
DDP's reducer its all_reduce, the paper's ZeRO its reduce_scatter and all_gather; FSDP none."""


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


def _tensor_parallel(strategy: str, lay: Layout, world: int, tp: TensorParallel, grad_clip: bool) -> list[Call]:
    """TP's calls inside each group of T consecutive ranks, the strategy's over D = N / T strided ones, the clip."""
    t, d = tp.size, tp.dp
    if t * d != world:
        raise ValueError(f"tp {t} x dp {d} is not the world {world}")
    calls = [Call(op, numel * tp.itemsize, t, phase="critical") for op, numel, k in tp.collectives for _ in range(k)]
    calls += [dataclasses.replace(c, span=c.ranks_spanned * t) for c in plan(strategy, lay, d, grad_clip=False)]
    if d == 1:  # a data-parallel group of one rank: what the engine still calls on it (nothing moves)
        calls += [Call(op, x * lay.itemsize, 1) for x in lay.bucket_numels for op in ONE_RANK.get(strategy, ())]
    sizes = {"tp": t, "dp": d}
    if grad_clip:
        calls += [Call("all_reduce", 4, sizes[dim], span=t if dim == "tp" else world, phase="after")
                  for dims in tp.norm_dims for dim in dims if sizes[dim] > 1]
    return calls


def _padded(numel: int, n: int) -> int:
    return -(-numel // n) * n


def param_rows(shape) -> tuple[int, int]:
    """(rows, elements per row) of a parameter: dim 0 is what FSDP splits (a 0-dim one is one row)."""
    rows = shape[0] if len(shape) else 1
    return rows, (math.prod(shape) // rows if rows else math.prod(shape[1:]))


def padded_unit(param_rows_: tuple[tuple[int, int], ...], n: int) -> int:
    """Elements one all_gather of a unit moves over n ranks: each parameter padded to n ceil(R/n) rows."""
    return sum(n * -(-r // n) * c for r, c in param_rows_)


def plan(strategy: str, lay: Layout, world: int, shard_size: int | None = None, grad_clip: bool = True,
         tp: TensorParallel | None = None) -> list[Call]:
    """Every collective one step of `strategy` issues, per rank, at `world` ranks (with `tp`: a
    tensor-parallel row, `lay` the sliced model's layout)."""
    if tp is not None and tp.size > 1:
        return _tensor_parallel(strategy, lay, world, tp, grad_clip)
    g_b, p_b, n = lay.itemsize, lay.gather_itemsize, world
    if n <= 1 or strategy == "single":
        return []
    if strategy in ("zero1", "zero2"):  # bucket_numels: the buckets as built (padded); else padded here
        calls = [c for x in lay.bucket_numels for c in (Call("reduce_scatter", _padded(x, n) * g_b, n),
                                                          Call("all_gather", _padded(x, n) * p_b, n, phase="after"))]
        return calls + ([Call("all_reduce", 4, n, phase="after")] if grad_clip else [])
    if strategy in ("ddp", "zero1_broadcast"):
        calls = [Call("all_reduce", x * g_b, n) for x in lay.bucket_numels]
        if strategy == "zero1_broadcast":
            shares = [lay.psi // n] * n if lay.even_shares else [sum(s) for s in owner_shares(lay.param_numels, n) if s]
            calls += [Call("broadcast", s * p_b, n, phase="after") for s in shares]
        return calls
    if strategy == "no_shard":
        return [Call("all_reduce", u * g_b, n) for u in lay.unit_numels]
    g = (shard_size or n) if strategy == "hybrid_shard" else n
    r = n // g
    calls = []
    for i, u in enumerate(lay.unit_numels):
        # full_shard gathers again in backward, except the unit that ends the forward (the root,
        # first here), whose parameters stay gathered into backward (minidist.fsdp.unit)
        padded = padded_unit(lay.unit_param_rows[i], g) if lay.unit_param_rows else _padded(u, g)
        calls.append(Call("all_gather", padded * p_b, g, phase="forward"))
        if strategy != "shard_grad_op" and i != 0:
            calls.append(Call("all_gather", padded * p_b, g))
        calls.append(Call("reduce_scatter", padded * g_b, g))
        if r > 1:
            calls.append(Call("all_reduce", padded // g * g_b, r, span=n))
    if grad_clip and g > 1:
        calls.append(Call("all_reduce", 4, g, phase="after"))
    return calls


def ring_bytes(calls: list[Call]) -> int:
    """Bytes one rank sends for `calls` under the ring model, as the trace counts them."""
    return sum(ring_bytes_sent(c.op, c.payload, c.group_size) for c in calls)


def calls_by_op(calls: list[Call]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in calls:
        out[c.op] = out.get(c.op, 0) + 1
    return out
