"""strategy=full_shard, shard_grad_op, no_shard, hybrid_shard: minidist.FSDP with FSDP2's arguments.

The four names are FSDP1's sharding strategies, the recipes' choice; each record sets what FSDP2
asks instead: reshard_after_forward (full_shard and hybrid_shard free the gathered parameters
after forward and gather again in backward; shard_grad_op and no_shard keep them), and the mesh
(hybrid_shard over ("replicate", "shard"); no_shard over the same 2-D mesh with a shard of one rank,
FSDP2's replication).

Per step and rank, S the parameters' bytes (each padded to whole rows per rank: minidist.shape),
N the ranks, G hybrid_shard's shard group and R = N / G its replicas:

    shard_grad_op   per unit: all_gather (forward), reduce_scatter                 2 S (N-1)/N
    full_shard      per unit: all_gather (forward), all_gather (backward, freed     (3 S - S_root) (N-1)/N
                    after forward; not the root, kept), reduce_scatter
    no_shard        one all_reduce per unit                                        2 S (N-1)/N
    hybrid_shard    full_shard in a shard group of G, then an all_reduce of each    (3 S - S_root) (G-1)/G
                    reduced shard across the R replicas                            + 2 (S/G) (R-1)/R

G is strategy.shard_size, or the processes per node (the gathers stay on the node's fast links):
the runtime's mesh, the memory estimate and the projection all ask state_group() for it.

Under context parallelism (strategy.cp_size = C) the cp ranks hold the same weights and saw other
tokens, so FSDP spans them too: full_shard and shard_grad_op over "dp_cp" (N = dp x C), hybrid_shard
over ("replicate", "shard_cp"), a shard group of G = shard_size x C (torchtitan's dp_shard_cp), and
no_shard over ("replicate_cp", "shard" = 1), the replicas being dp x C (minidist.mesh.Layout.hybrid_dims).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minidist.fsdp import FSDP, prefetch_ahead
from minidist.fsdp import footprint as fsdp_footprint
from minidist.fsdp.schedule import DEFAULT_PREFETCH
from minidist.mesh import REPLICATE, REPLICATE_CP, SHARD, SHARD_CP, ParallelDims
from minidist.precision import MixedPrecisionPolicy
from minidist.strategies import contract
from minidist.strategies.record import (DATA_PARALLEL, SETTINGS, Call, Strategy, clip_call, engine_mesh, every_rank,
                                        padded)
from minidist.strategies.registry import register
from minidist.strategies.schema import DataParallelStrategy, DType


@dataclass
class FSDPStrategy(DataParallelStrategy):
    """minidist.FSDP: parameters, gradients (and optimizer state) sharded over ranks. The strategy's name
    sets FSDP2's arguments (this module's records): reshard_after_forward, and the 2-D mesh of
    hybrid_shard and no_shard."""

    name: str = "full_shard"
    """Sharding strategy: full_shard, shard_grad_op, no_shard or hybrid_shard (set by the preset)."""
    wrap_blocks: bool = True
    """Make every repeated block of the model (GPT Block, ResNet BasicBlock) its own FSDP unit."""
    prefetch: int = DEFAULT_PREFETCH
    """Units each unit all-gathers ahead of use, in forward and in backward (FSDP2's explicit prefetch,
    set by module order: minidist.fsdp.prefetch_ahead); 1 = FSDP2's default, 0 = none."""
    param_dtype: Optional[DType] = None
    """Dtype parameters are all-gathered and computed in (null = their own)."""
    reduce_dtype: Optional[DType] = None
    """Dtype gradients are reduce-scattered in (null = param_dtype)."""


@dataclass
class HybridShardStrategy(FSDPStrategy):
    """FSDP within groups of shard_size ranks, DDP-style all_reduce across the groups."""

    name: str = "hybrid_shard"
    """Strategy name (set by the preset; do not override)."""
    shard_size: Optional[int] = None
    """Ranks per shard group (null = processes per node, LOCAL_WORLD_SIZE)."""


# ------------------------------------------------------------------------- the engine
HYBRID = f'("{REPLICATE}", "{SHARD}") (("{REPLICATE}", "{SHARD_CP}") with cp)'
HYBRID_NO_SHARD = f'("{REPLICATE}", "{SHARD}" = 1) (("{REPLICATE_CP}", "{SHARD}" = 1) with cp)'
"""Where the 2-D engines run, in the records' words (minidist.mesh.Layout.hybrid_dims): cp ranks hold the
same weights, so they join the shard dimension where it shards, the replicate one where it does not."""


def _wrapper(hybrid: bool, reshard_after_forward: bool):
    """wrap_model of an FSDP record: FSDP2's arguments over the engine's mesh: "dp" ("dp_cp" with cp), or
    the 2-D hybrid mesh (layout.hybrid_dims: ("replicate", "shard"), cp joined to one of them)."""

    def wrap(model, layout, cfg, blocks, mp_policy):
        policy = mp_policy or MixedPrecisionPolicy(cfg.param_dtype.torch_dtype if cfg.param_dtype else None,
                                                   cfg.reduce_dtype.torch_dtype if cfg.reduce_dtype else None)
        mesh = layout[layout.hybrid_dims] if hybrid else engine_mesh(layout)
        model = FSDP(model, mesh=mesh, wrap=set(blocks) if cfg.wrap_blocks else None,
                     reshard_after_forward=reshard_after_forward, mp_policy=policy)
        if cfg.prefetch != DEFAULT_PREFETCH:  # else FSDP2's default: the next unit in the recorded order
            prefetch_ahead(model.units, cfg.prefetch, cfg.prefetch)
        return model
    return wrap


def _held(shape, cfg, world, group, *, optimizer, backend, device_type, shard_size=None):
    return fsdp_footprint.held(shape, cfg.name, world, shard_size=shard_size, optimizer=optimizer, backend=backend,
                               device_type=device_type, prefetch=cfg.get("prefetch", DEFAULT_PREFETCH))


def padded_unit(param_rows: tuple[tuple[int, int], ...], n: int) -> int:
    """Elements one all_gather of a unit moves over n ranks: each parameter padded to n ceil(R/n) rows."""
    return sum(n * -(-r // n) * c for r, c in param_rows)


def _units(shape, n: int) -> list[int]:
    """Each unit with parameters, root first, padded as FSDP shards it over n ranks (a unit of a model
    known only by its size: one flat buffer)."""
    return [padded_unit(shape.rows(u), n) if shape.shapes_known else padded(numel, n)
            for u, numel in enumerate(shape.unit_numels) if numel]


def _sharded_calls(reshard: bool):
    """The plan of FSDP sharding over a group of `group` ranks, replicated over world / group."""

    def collectives(shape, wire, world, group, grad_clip) -> list[Call]:
        g_b, p_b, r = wire.reduce_bytes(shape), wire.gather_bytes(shape), world // group
        calls = []
        for i, unit in enumerate(_units(shape, group)):
            calls.append(Call("all_gather", unit * p_b, group, phase="forward"))
            if reshard and i != 0:  # the root ends the forward: its parameters stay gathered into backward
                calls.append(Call("all_gather", unit * p_b, group))
            calls.append(Call("reduce_scatter", unit * g_b, group))
            if r > 1:
                calls.append(Call("all_reduce", unit // group * g_b, r, span=world))
        return calls + (clip_call(group) if grad_clip else [])
    return collectives


def _no_shard_calls(shape, wire, world, group, grad_clip) -> list[Call]:
    return [Call("all_reduce", u * wire.reduce_bytes(shape), world) for u in shape.unit_numels if u]


def _dims(shard: int, hybrid: bool = False):
    """shard -1: every data-parallel rank shards ("dp"); 1: replicated over the 2-D mesh, cp ranks with the replicas."""
    def dims(cfg, world: int, local_world: int | None = None) -> ParallelDims:
        return ParallelDims.infer(world, tp=cfg.get("tp_size", 1), pp=cfg.get("pp_size", 1), cp=cfg.get("cp_size", 1),
                                  shard=shard, hybrid=hybrid, settings=SETTINGS, cp_joins=REPLICATE)
    return dims


def _fsdp(name: str, summary: str, zero_stage: int, closed_form: str, collectives, *, reshard: bool,
          shard: int, default_rows: tuple[int, ...] = (1,)) -> Strategy:
    """A strategy FSDP runs over every data-parallel rank: sharded over "dp" (shard -1), or replicated
    as FSDP2 replicates, over ("replicate", "shard") with a shard of one rank (shard 1)."""
    engine = DATA_PARALLEL if shard == -1 else HYBRID_NO_SHARD
    return Strategy(
        name=name, summary=summary, engine=f"minidist.FSDP(reshard_after_forward={reshard}) over {engine}",
        schema=FSDPStrategy, zero_stage=zero_stage, closed_form=closed_form,
        dims=_dims(shard, hybrid=shard != -1), held=_held, collectives=collectives,
        wrap_model=_wrapper(shard != -1, reshard), model_engine=contract.ShardedModel, default_rows=default_rows)


SHARD_GRAD_OP = register(_fsdp("shard_grad_op", "gradients and optimizer state; parameters between steps", 2,
                               "2S(N-1)/N", _sharded_calls(reshard=False), reshard=False, shard=-1))
FULL_SHARD = register(_fsdp("full_shard", "parameters, gradients and optimizer state", 3, "(3S-S_root)(N-1)/N",
                            _sharded_calls(reshard=True), reshard=True, shard=-1))
NO_SHARD = register(_fsdp("no_shard", "nothing (DDP on FSDP's machinery)", 0, "2S(N-1)/N", _no_shard_calls,
                          reshard=False, shard=1, default_rows=()))


# ------------------------------------------------------------------------ hybrid_shard
def _shard_group(cfg, world: int, local_world: int | None) -> int:
    """The "shard" degree: strategy.shard_size, or the processes per node over tp and cp (the whole world
    where that is unknown), at most the data-parallel ranks (a pipeline's stages share the node)."""
    cp = max(cfg.get("cp_size", 1), 1)
    return cfg.shard_size or max(1, min((local_world or world) // max(cfg.get("tp_size", 1), 1) // cp,
                                        every_rank(cfg, world, local_world) // cp))


def _hybrid_dims(cfg, world: int, local_world: int | None = None) -> ParallelDims:
    return ParallelDims.infer(world, tp=cfg.get("tp_size", 1), pp=cfg.get("pp_size", 1), cp=cfg.get("cp_size", 1),
                              shard=_shard_group(cfg, world, local_world), hybrid=True, settings=SETTINGS)


def _hybrid_group(cfg, world: int, local_world: int | None) -> int:
    """The ranks FSDP shards over: the shard group, times cp (its ranks join it: minidist.mesh.SHARD_CP),
    no larger than the data-parallel ranks (a tabulated world smaller than a node)."""
    return min(_shard_group(cfg, world, local_world) * max(cfg.get("cp_size", 1), 1),
               every_rank(cfg, world, local_world))


def check_shard_size(cfg, key: str, worlds: list[int], local_world: int | None = None,
                     worlds_key: str | None = None) -> None:
    """hybrid_shard's shard group must divide the world (a (world / shard) x shard mesh); null = the
    processes per node (local_world; the whole world where that is unknown). worlds_key: the worlds
    are a tabulation's (the comparison's estimate.worlds), where a group larger than a world means
    that whole world; else `worlds` is this job's one world. With tensor parallelism the mesh's own
    rule (ParallelDims) names the degrees."""
    if cfg.get("tp_size", 1) != 1:
        return
    key, shard_size, clamp = f"{key}.shard_size", cfg.shard_size, worlds_key is not None

    def fits(size: int, world: int) -> bool:
        return world % (min(size, world) if clamp else size) == 0

    for world in worlds:
        shard = shard_size or local_world or world
        if fits(shard, world):
            continue
        valid = ", ".join(str(d) for d in range(1, max(worlds) + 1) if all(fits(d, w) for w in worlds))
        where = f"{worlds_key} entry {world}" if clamp else f"the {world} ranks of this job"
        if shard_size is None:
            raise ValueError(f"{key}=null means the processes per node ({shard}), which do not divide {where}; "
                             f"set {key} to one of {valid}")
        null = f"; null = the processes per node ({local_world})" if local_world else ""
        raise ValueError(f"{key}={shard} does not divide {where}: hybrid_shard needs a (world / shard) x shard "
                         f"mesh; valid sizes: {valid}{null}")


def _hybrid_note(world: int, group: int) -> str:
    return f"shard group = all {world} ranks, one replica: this is full_shard" if group >= world else ""


HYBRID_SHARD = register(Strategy(
    name="hybrid_shard", summary="full_shard's, inside groups of G ranks; replicated across N / G groups",
    engine=f"minidist.FSDP(reshard_after_forward=True) over {HYBRID}",
    schema=HybridShardStrategy, zero_stage=3,
    closed_form="(3S-S_root)(G-1)/G + 2(S/G)(R-1)/R", dims=_hybrid_dims,
    held=lambda shape, cfg, world, group, **kw: _held(shape, cfg, world, group, shard_size=group, **kw),
    collectives=_sharded_calls(reshard=True), state_group=_hybrid_group,
    wrap_model=_wrapper(True, reshard_after_forward=True),
    model_engine=contract.ShardedModel, check=check_shard_size, note=_hybrid_note, group_symbol="G",
    default_rows=(1,), tp_rows=False))
