"""What each strategy must communicate per step, call by call, from the model's structure.

    lay = Layout.from_model(model_on_meta, blocks, bucket_numels)
    calls = plan("full_shard", lay, world=8)
    ring_bytes(calls)            # bytes one rank sends: the textbook formulas, summed over the calls

Per step and rank, S = bytes of the parameters (FSDP: every parameter padded to a multiple of
the shard group's size in rows, dim 0, as minidist.fsdp shards it), N ranks, ring model (minidist.comm.trace.ring_bytes_sent):

    ddp            one all_reduce per gradient bucket                     2 S (N-1)/N
    zero1, zero2   per bucket: reduce_scatter (backward), all_gather of the  2 S (N-1)/N
                   updated partitions (after step), buckets padded to N
    zero1_broadcast  ddp's, plus one broadcast of each owner's share of    2 S (N-1)/N + S
                   the updated parameters (every rank forwards each share
                   in a pipelined ring; an all_gather would send S (N-1)/N)
    shard_grad_op  per unit: all_gather (forward), reduce_scatter          2 S (N-1)/N
    full_shard     per unit: all_gather (forward), all_gather (backward,   3 S (N-1)/N
                   freed after forward), reduce_scatter
    hybrid_shard   full_shard in a shard group of G, then an all_reduce    3 S (G-1)/G + 2 (S/G)(R-1)/R
                   of each reduced shard across the R = N/G replicas
    no_shard       one all_reduce per unit                                 2 S (N-1)/N

plus, for the FSDP strategies, the gradient-norm all_reduce of one fp32 scalar when clipping.
A backend may move more than the logical collective: gloo's own reduce_scatter is an all_reduce
of the whole input that keeps one chunk (2 S (N-1)/N instead of S (N-1)/N). What really ran and
its bytes come from the trace (Record.wire_op, Record.wire_bytes; minidist.comm.ring on gloo).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn as nn

from minidist.comm.trace import ring_bytes_sent
from minidist.zero.partition import partition_by_numel

CLOSED_FORM = {"ddp": "2S(N-1)/N", "zero1": "2S(N-1)/N", "zero2": "2S(N-1)/N", "zero1_broadcast": "2S(N-1)/N + S",
               "shard_grad_op": "2S(N-1)/N",
               "full_shard": "(3S-S_root)(N-1)/N", "hybrid_shard": "(3S-S_root)(G-1)/G + 2(S/G)(R-1)/R",
               "no_shard": "2S(N-1)/N",
               "single": "0"}


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

    @property
    def ranks_spanned(self) -> int:
        return self.span or self.group_size


@dataclass(frozen=True)
class Layout:
    """The sizes a strategy's collectives are made of (elements)."""

    param_numels: tuple[int, ...]
    """Every parameter once (ZeRO-1 partitions them by numel)."""
    unit_numels: tuple[int, ...]
    """FSDP units, root first (minidist.fsdp's assignment for the wrapped block types)."""
    bucket_numels: tuple[int, ...]
    """DDP's gradient buckets as the reducer built them."""
    itemsize: int = 4
    even_shares: bool = False
    """ZeRO-1: N equal shares instead of partitioning param_numels (a model known only by its size)."""
    unit_param_rows: tuple[tuple[tuple[int, int], ...], ...] = ()
    """FSDP units' parameters as (rows, elements per row): each is padded to whole rows per rank
    (empty: a model known only by its size, padded as one flat unit)."""

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
    def uniform(cls, psi: float, layers: int, bucket_cap_bytes: int, itemsize: int = 2) -> "Layout":
        """A model of psi parameters in `layers` equal units and parameters, DDP buckets of the cap."""
        per_layer = int(psi // layers)
        per_bucket = max(1, bucket_cap_bytes // itemsize)
        n_buckets = -(-int(psi) // per_bucket)
        return cls((per_layer,) * layers, (per_layer,) * layers, (int(psi) // n_buckets,) * n_buckets, itemsize,
                   even_shares=True)

    @property
    def psi(self) -> int:
        return sum(self.param_numels)


class _Numel:
    """What partition_by_numel reads of a parameter."""

    def __init__(self, n: int):
        self._n = n

    def numel(self) -> int:
        return self._n


def zero1_partition(param_numels, n: int) -> list[list[int]]:
    """ZeRO-1's owners (minidist.zero.partition): the parameter sizes each of the n ranks updates."""
    owner = partition_by_numel([_Numel(x) for x in param_numels], n)
    return [[x for x, r in zip(param_numels, owner) if r == rank] for rank in range(n)]


def _padded(numel: int, n: int) -> int:
    return -(-numel // n) * n


def param_rows(shape) -> tuple[int, int]:
    """(rows, elements per row) of a parameter: dim 0 is what FSDP splits (a 0-dim one is one row)."""
    rows = shape[0] if len(shape) else 1
    return rows, (math.prod(shape) // rows if rows else math.prod(shape[1:]))


def padded_unit(param_rows_: tuple[tuple[int, int], ...], n: int) -> int:
    """Elements one all_gather of a unit moves over n ranks: each parameter padded to n ceil(R/n) rows."""
    return sum(n * -(-r // n) * c for r, c in param_rows_)


def plan(strategy: str, lay: Layout, world: int, shard_size: int | None = None, grad_clip: bool = True) -> list[Call]:
    """Every collective one step of `strategy` issues, per rank, at `world` ranks."""
    b, n = lay.itemsize, world
    if n <= 1 or strategy == "single":
        return []
    if strategy in ("zero1", "zero2"):
        calls = [Call(op, _padded(x, n) * b, n) for x in lay.bucket_numels for op in ("reduce_scatter", "all_gather")]
        return calls + ([Call("all_reduce", 4, n)] if grad_clip else [])
    if strategy in ("ddp", "zero1_broadcast"):
        calls = [Call("all_reduce", x * b, n) for x in lay.bucket_numels]
        if strategy == "zero1_broadcast":
            shares = ([lay.psi // n] * n if lay.even_shares else
                      [sum(s) for s in zero1_partition(lay.param_numels, n) if s])
            calls += [Call("broadcast", s * b, n) for s in shares]
        return calls
    if strategy == "no_shard":
        return [Call("all_reduce", u * b, n) for u in lay.unit_numels]
    g = (shard_size or n) if strategy == "hybrid_shard" else n
    r = n // g
    calls = []
    for i, u in enumerate(lay.unit_numels):
        # full_shard gathers again in backward, except the unit that ends the forward (the root,
        # first here), whose parameters stay gathered into backward (minidist.fsdp.unit)
        gathers = 1 if strategy == "shard_grad_op" or i == 0 else 2
        s = (padded_unit(lay.unit_param_rows[i], g) if lay.unit_param_rows else _padded(u, g)) * b
        calls += [Call("all_gather", s, g)] * gathers + [Call("reduce_scatter", s, g)]
        if r > 1:
            calls.append(Call("all_reduce", s // g, r, span=n))
    if grad_clip and g > 1:
        calls.append(Call("all_reduce", 4, g))
    return calls


def ring_bytes(calls: list[Call]) -> int:
    """Bytes one rank sends for `calls` under the ring model, as the trace counts them."""
    return sum(ring_bytes_sent(c.op, c.payload, c.group_size) for c in calls)


def calls_by_op(calls: list[Call]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in calls:
        out[c.op] = out.get(c.op, 0) + 1
    return out
