"""A parallelism strategy as one record: everything minidist knows about it, written once.

    s = minidist.strategies.get("full_shard")
    dims = s.dims(cfg, world=8, local_world=8)              # its mesh: minidist.mesh.ParallelDims
    model = s.wrap_model(model, layout, cfg, blocks, mp_policy)
    optimizer = s.build_optimizer(model, layout, cfg, torch.optim.AdamW, {"lr": 1e-3}, mp_policy)
    s.held(shape, cfg, world, group, optimizer=..., backend=..., device_type=...)   # its memory, instant by instant
    s.collectives(shape, wire, world, group, grad_clip=True)                       # what it sends per step

`cfg` is the strategy's config (its `schema`, as Hydra composed it, or `s.preset()`); `world` the
data-parallel ranks; `group` the ranks its sharded model states are split over, `s.state_group(cfg,
world, local_world)`: every rank of the world, except hybrid_shard's shard group, the processes per
node unless strategy.shard_size says otherwise, at runtime, in the estimate and in the projection alike.

Who reads what: minidist.parallel builds the layout (dims), wraps the model and builds the optimizer;
the training loop and the checkpoints ask which contract the engines offer (model_engine,
optimizer_engine: minidist.strategies.contract), never the objects; minidist.cli registers each
schema as a choice of the strategy group; minidist.compare estimates memory (held, zero_stage),
prices the collectives (collectives, one_rank_calls, closed_form) and picks its rows
(default_rows, tp_rows, comparable). A new strategy is one Strategy(...) given to register().
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from minidist.mesh import CP, DP, DP_CP, PP, SHARD, TP

SETTINGS = {TP: "strategy.tp_size", SHARD: "strategy.shard_size", CP: "strategy.cp_size", PP: "strategy.pp_size"}
"""The config keys that set each degree of a strategy's mesh, for one-line errors (ParallelDims.infer)."""

STATES = {0: "(p+g+K) psi", 1: "(p+g) psi + K psi/N", 2: "p psi + (g+K) psi/N", 3: "(p+g+K) psi/N"}
"""ZeRO's model states per rank by stage (Rajbhandari et al. 2020, Figure 1): psi parameters of p bytes,
gradients of g, K bytes of optimizer state per parameter, sharded over N ranks."""


@dataclass(frozen=True)
class Call:
    """One collective of a step, as a strategy plans it (minidist.compare prices and checks the list)."""

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
class Wire:
    """How an engine moves a model (minidist.shape.ModelShape): its gradient buckets, the bytes per element."""

    bucket_numels: tuple[int, ...] = ()
    """The gradient buckets as the engine built them (DDP's reducer's; ZeRO's, padded to N);
    () = one bucket of every parameter."""
    itemsize: int = 0
    """Bytes per gradient element reduced (0 = the model's own)."""
    gather_itemsize: int = 0
    """Bytes per parameter element gathered or broadcast (0 = itemsize)."""

    @classmethod
    def even_buckets(cls, psi: float, bucket_cap_bytes: int, itemsize: int = 4, gather_itemsize: int = 0) -> Wire:
        """Buckets of about bucket_cap_bytes each, equal, for a model known only by its size."""
        per_bucket = max(1, bucket_cap_bytes // itemsize)
        n_buckets = -(-int(psi) // per_bucket)
        return cls((int(psi) // n_buckets,) * n_buckets, itemsize, gather_itemsize)

    def buckets(self, shape) -> tuple[int, ...]:
        return self.bucket_numels or (shape.psi,)

    def reduce_bytes(self, shape) -> int:
        return self.itemsize or shape.itemsize

    def gather_bytes(self, shape) -> int:
        return self.gather_itemsize or self.reduce_bytes(shape)


def padded(numel: int, n: int) -> int:
    """numel rounded up to a multiple of n (equal pieces for a reduce_scatter or an all_gather)."""
    return -(-numel // n) * n


def clip_call(group: int) -> list[Call]:
    """The clip's one fp32 scalar all_reduce over the ranks a gradient is split over (none when whole)."""
    return [Call("all_reduce", 4, group, phase="after")] if group > 1 else []


DATA_PARALLEL = f'"{DP}" ("{DP_CP}" with cp)'
"""Where a one-dimensional engine runs, in the records' words (engine_mesh)."""


def engine_mesh(layout):
    """The 1-D mesh a data-parallel engine spans: "dp", or under context parallelism "dp_cp" (dp x cp
    flattened, torchtitan's dp_shard_cp). cp ranks hold the same weights but saw different tokens, so
    their gradients are averaged together with the data-parallel ones, in the engine's one reduction
    (2 psi e (dp cp - 1)/(dp cp) per rank for DDP), and FSDP and ZeRO shard over all dp cp ranks."""
    return layout[DP_CP]


# ----------------------------------------------------------------------- defaults
def keep_model(model, layout, cfg, blocks, mp_policy):
    """No model wrapper (single, the ZeRO strategies)."""
    return model


def plain_optimizer(model, layout, cfg, optim_cls, optim_kwargs, mp_policy):
    """torch's optimizer over whatever the model trains (its parameters, or FSDP's shards of them)."""
    return optim_cls(model.parameters(), **optim_kwargs)


def every_rank(cfg, world: int, local_world: int | None) -> int:
    """The data-parallel ranks: world / (tp pp) (its states, if sharded, are split over all of them)."""
    return world // max(cfg.get("tp_size", 1), 1) // max(cfg.get("pp_size", 1), 1)


def no_buckets(model, optimizer) -> list[int]:
    return []


def no_check(cfg, key: str, worlds: list[int], local_world: int | None, worlds_key: str | None = None) -> None:
    return None


def no_note(world: int, group: int) -> str:
    return ""


# ------------------------------------------------------------------------ record
@dataclass(frozen=True)
class Strategy:
    """Everything about one strategy (module docstring): data, and small functions of its config."""

    name: str
    """Its config name: strategy=<name>, configs/strategy/<name>.yaml."""
    summary: str
    """What it shards, in words (the docs' ladder)."""
    engine: str
    """What runs it, in words (the docs' table)."""
    schema: type
    """Its config dataclass: the keys strategy.* accepts, with types and --help text."""
    zero_stage: int
    """What it shards of the model states, as a ZeRO stage: 0 nothing, 1 the optimizer state, 2 + the
    gradients, 3 + the parameters (model_state_bytes, the paper's table)."""
    closed_form: str
    """Bytes one rank sends per step (S: the parameters' bytes, N: ranks), as the tables print it."""
    dims: Callable[[Any, int, int | None], Any]
    """(cfg, world, processes per node or None) -> ParallelDims; ValueError (one line) if the world cannot hold it."""
    held: Callable[..., list]
    """(shape, cfg, world, group, *, optimizer, backend, device_type) -> list[minidist.footprint.Held]:
    what its engine holds at each instant of a step, from the engine's own footprint module."""
    collectives: Callable[..., list[Call]]
    """(shape, wire, world, group, grad_clip) -> every Call one step issues per rank, at world > 1."""
    wrap_model: Callable = keep_model
    """(model, layout, cfg, block types, mp_policy) -> what forward and backward run on."""
    build_optimizer: Callable = plain_optimizer
    """(model, layout, cfg, optim_cls, optim_kwargs, mp_policy) -> the optimizer the loop steps."""
    state_group: Callable[[Any, int, int | None], int] = every_rank
    """(cfg, world, processes per node or None) -> the ranks its sharded states are split over."""
    model_engine: type | None = None
    """The contract (minidist.strategies.contract) of what wrap_model returns; None: the plain model."""
    optimizer_engine: type | None = None
    """The contract of what build_optimizer returns; None: a plain torch optimizer."""
    buckets: Callable[[Any, Any], list[int]] = no_buckets
    """(model, optimizer) -> the gradient buckets' elements as its engine built them (sizes only)."""
    one_rank_calls: tuple[str, ...] = ()
    """The calls its engine still issues per bucket over a data-parallel group of one rank (pure TP, D = 1)."""
    check: Callable = no_check
    """(cfg, key, worlds, local_world, worlds_key) -> None: its settings against these worlds; ValueError
    naming `key`.<setting> (key: where the config sits, e.g. "strategy")."""
    note: Callable[[int, int], str] = no_note
    """(world, group) -> what a comparison row at that world should say about it ("" for nothing)."""
    group_symbol: str = "N"
    """The letter its formulas use for the ranks its states are split over."""
    default_rows: tuple[int, ...] = ()
    """The comparison's default rows of it, by tensor-parallel degree (1: the plain row; 2: <name>+tp2)."""
    tp_rows: bool = True
    """Whether the comparison prices it with tensor parallelism inside (<name>+tp<T>)."""
    comparable: bool = True
    """Whether it can be a row of the comparison at all (single cannot: the comparison's baseline is it)."""

    def preset(self, **fields) -> DictConfig:
        """Its config with the schema's defaults (and `fields`), as composing strategy=<name> gives it."""
        known = {f.name for f in dataclasses.fields(self.schema)}
        if set(fields) - known:
            raise ValueError(f"strategy {self.name} has no setting {', '.join(sorted(set(fields) - known))}; "
                             f"its settings: {', '.join(sorted(known - {'name'}))}")
        return OmegaConf.structured(self.schema(**({"name": self.name} | fields)))

    @property
    def states_formula(self) -> str:
        """ZeRO's model states per rank, in the letter of its state group."""
        return STATES[self.zero_stage].replace("/N", f"/{self.group_symbol}")

    def model_state_bytes(self, psi: float, group: int, param_bytes: float = 4, grad_bytes: float = 4,
                          optim_bytes: float = 8) -> dict[str, float]:
        """ZeRO's per-rank model-state bytes (parameters, gradients, optimizer state, total) over `group` ranks."""
        stage = self.zero_stage
        out = {"parameters": param_bytes * psi / (group if stage >= 3 else 1),
               "gradients": grad_bytes * psi / (group if stage >= 2 else 1),
               "optimizer": optim_bytes * psi / (group if stage >= 1 else 1)}
        return out | {"total": sum(out.values())}
