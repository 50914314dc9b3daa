"""The parallel layout of a job: named dimensions, their degrees, and every question asked of them.

    dims = ParallelDims.infer(world_size=4, shard=2, hybrid=True)   # degrees, checked against the world
    layout = dims.build("cpu")          # a torch DeviceMesh with named dimensions, and its sub-meshes
    layout["dp"], layout["shard"]       # the 1-D mesh an engine spans, by name
    layout.dp_rank, layout.is_main      # which data shard is mine, am I the process that writes files

Four kinds of dimension (torchtitan's ParallelDims, Megatron's groups):

    replicate  data parallel, parameters copied (DDP's all_reduce, hybrid FSDP across replicas)
    shard      data parallel, parameters split (FSDP's all_gather and reduce_scatter)
    cp         context parallel: ranks hold different tokens of the same sequences, the same weights
               (between data parallelism and tp: its ring runs every layer too; "dp_cp" flattens both)
    tp         tensor parallel: ranks hold slices of the same layers and read the same data
    pp         pipeline parallel: ranks hold different layers (stages) and read the same data,
               outermost (its point-to-point messages are the cheapest: across nodes)

A mesh lays the ranks out as an array, tp innermost (tp's collectives run every layer, so
its ranks are consecutive: the same node). Data parallelism that is only replicated or only
sharded is one dimension, "dp"; hybrid sharding keeps both, ("replicate", "shard"), and
"dp" is then their flattening (one group over both, for the data-parallel reductions).
At N = 8, hybrid, shard = 2, tp = 2:

                  shard 0          shard 1
                  tp 0    tp 1     tp 0    tp 1
    replicate 0   rank 0  rank 1   rank 2  rank 3
    replicate 1   rank 4  rank 5   rank 6  rank 7

    tp group of rank 0: {0, 1}   shard group: {0, 2}   replicate group: {0, 4}   dp group: {0, 2, 4, 6}

Engines are handed the sub-mesh they work over by name (layout["dp"], layout["tp"]),
never a global, and use ranks inside their groups. The trainer asks the questions below
(which data shard is mine, who writes files, over which ranks a loss or a norm is summed)
of the layout, never of the global rank: a new dimension changes the answers here, in one
place. Where a parameter is split over a dimension, `shard_param` says so on the parameter
itself, and clipping and checkpoints read it (minidist.sharding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from minidist import comm
from minidist.runtime import Topology
from minidist.sharding import SHARDED_OVER, Split, shard_param, sharded_over  # noqa: F401 - the layout's users
# declare split parameters through minidist.mesh too; minidist.sharding is where the declaration lives

DP = "dp"
"""Data parallelism as one dimension (DDP, ZeRO, full_shard, ...), or the flattening of (replicate, shard)."""
REPLICATE, SHARD = "replicate", "shard"
"""The two dimensions of hybrid sharding: across replicas, and within a shard group (FSDP2's order)."""
CP = "cp"
"""The context-parallel dimension: ranks that read the same sequences and keep different tokens of them
(minidist.cp). They hold the same weights but see different tokens, so their gradients are reduced
together with the data-parallel ones: over DP_CP."""
DP_CP = "dp_cp"
"""The data-parallel dimensions and cp flattened into one (torchtitan's dp_cp): what DDP and FSDP span
under context parallelism. Without cp it is "dp"."""
SHARD_CP, REPLICATE_CP = "shard_cp", "replicate_cp"
"""Hybrid sharding's dimensions with the cp ranks joined (FSDP2's 2-D mesh under context parallelism:
Layout.hybrid_dims). cp ranks hold the same weights, so they join the shard dimension where the engine
shards (hybrid_shard: torchtitan's dp_shard_cp), the replicate one where it only replicates (no_shard)."""
TP = "tp"
"""The tensor-parallel dimension: ranks that hold different slices of the same layers and see the same data."""
DATA_PARALLEL_DIMS = (DP, REPLICATE, SHARD)
"""Dimensions over which ranks see different data (cp is not one: its ranks read the same rows)."""
PP = "pp"
"""The pipeline dimension: ranks that hold different stages of the model (minidist.pp)."""
DIM_ORDER = (PP, REPLICATE, SHARD, DP, CP, TP)
"""Outermost first (torchtitan's order): the last dimension's ranks are consecutive."""

# ------------------------------------------------------------------------------- degrees
def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _processes(n: int) -> str:
    return f"the {n} processes of the job" if n != 1 else "the 1 process of the job"


@dataclass(frozen=True)
class ParallelDims:
    """How many ranks along each dimension; pp x replicate x shard x cp x tp is the world.

    hybrid: lay data parallelism out as two dimensions (replicate, shard) even where one
    of them is 1 (hybrid FSDP works over both); otherwise as one, "dp".
    """

    replicate: int = 1
    shard: int = 1
    tp: int = 1
    hybrid: bool = False
    pp: int = 1
    cp: int = 1
    cp_joins: str = SHARD
    """Hybrid under cp: the dimension the cp ranks join in the engine's 2-D mesh (SHARD or REPLICATE)."""

    @classmethod
    def infer(cls, world_size: int, *, tp: int = 1, shard: int = 1, hybrid: bool = False, pp: int = 1, cp: int = 1,
              settings: dict[str, str] | None = None, cp_joins: str = SHARD) -> ParallelDims:
        """The degrees for `world_size` ranks; shard=-1: every data-parallel rank shards (FSDP).

        A degree that does not fit is one line naming its setting (`settings` maps "tp", "pp" and
        "shard" to the user's names for them, e.g. "strategy.tp_size") and the valid values.
        """
        name = {TP: TP, SHARD: SHARD, PP: PP, CP: CP} | (settings or {})
        if tp < 1 or world_size % tp:
            raise ValueError(f"{name[TP]}={tp} must divide {_processes(world_size)}; "
                             f"valid: {_divisors(world_size)}")
        left, by = world_size // tp, f" / {name[TP]}={tp}" if tp > 1 else ""
        if pp < 1 or left % pp:
            ranks = f"the {left} ranks ({world_size} processes{by})" if tp > 1 else _processes(world_size)
            raise ValueError(f"{name[PP]}={pp} must divide {ranks}; valid: {_divisors(left)}")
        left, by = left // pp, by + (f" / {name[PP]}={pp}" if pp > 1 else "")
        if cp < 1 or left % cp:
            ranks = f"the {left} ranks ({world_size} processes{by})" if by else _processes(world_size)
            raise ValueError(f"{name[CP]}={cp} must divide {ranks}; valid: {_divisors(left)}")
        dp, by = left // cp, by + (f" / {name[CP]}={cp}" if cp > 1 else "")
        shard = dp if shard == -1 else shard
        if shard < 1 or dp % shard:
            ranks = f"{dp} data-parallel ranks ({world_size} processes{by})" if by else _processes(world_size)[4:]
            raise ValueError(f"{name[SHARD]}={shard} must divide the {ranks}; valid: {_divisors(dp)}")
        return cls(dp // shard, shard, tp, hybrid, pp, cp, cp_joins)

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different data shards the job reads."""
        return self.replicate * self.shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def names(self) -> tuple[str, ...]:
        """The mesh's dimensions, outermost first (pp, cp and tp only where they are > 1)."""
        return (((PP,) if self.pp > 1 else ()) + ((REPLICATE, SHARD) if self.hybrid else (DP,))
                + ((CP,) if self.cp > 1 else ()) + ((TP,) if self.tp > 1 else ()))

    @property
    def shape(self) -> tuple[int, ...]:
        sizes = {PP: self.pp, REPLICATE: self.replicate, SHARD: self.shard, DP: self.dp, CP: self.cp, TP: self.tp}
        return tuple(sizes[n] for n in self.names)

    def build(self, device_type: str) -> Layout:
        """The DeviceMesh (a collective: every rank builds it); for hybrid "dp" flattened, with cp "dp_cp"
        (and hybrid's 2-D mesh with cp joined: _hybrid_with_cp)."""
        mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=self.names)
        dp = (REPLICATE, SHARD) if self.hybrid else (DP,)
        flat = {DP: mesh[dp]._flatten(DP)} if self.hybrid else {}
        if self.cp > 1:
            flat[DP_CP] = mesh[(*dp, CP)]._flatten(DP_CP)
            if self.hybrid:
                flat |= self._hybrid_with_cp(mesh)
        return Layout(mesh, flat)

    def _hybrid_with_cp(self, mesh: DeviceMesh) -> dict:
        """FSDP2's 2-D mesh with the cp ranks joined to one of its dimensions (cp_joins): (replicate,
        shard x cp) or (replicate x cp, shard). A mesh of its own over the same ranks (torch warns against
        slicing a flattened dimension together with another)."""
        joined = SHARD_CP if self.cp_joins == SHARD else REPLICATE_CP
        names = [n for n in self.names if n != CP]
        ranks = mesh.mesh.movedim(self.names.index(CP), self.names.index(self.cp_joins) + 1)  # cp after it
        at = names.index(self.cp_joins)
        shape = [self.shape[self.names.index(n)] for n in names]
        shape[at] *= self.cp
        names[at] = joined
        whole = DeviceMesh(mesh.device_type, ranks.reshape(shape), mesh_dim_names=tuple(names))
        two = (REPLICATE, SHARD_CP) if joined == SHARD_CP else (REPLICATE_CP, SHARD)
        return {two: whole[two], joined: whole[joined]}


# -------------------------------------------------------------------------------- layout
class Layout:
    """A DeviceMesh with named dimensions, the sub-meshes flattened from it, and this rank's place.

    Layout(mesh) wraps any mesh built elsewhere (data_parallel_mesh, hybrid_mesh); its
    data-parallel reductions then run one all_reduce per dimension instead of one over "dp".
    """

    def __init__(self, mesh: DeviceMesh, flattened: dict[str, DeviceMesh] | None = None):
        self.mesh = mesh
        if mesh.mesh_dim_names is None and mesh.ndim != 1:
            raise ValueError(f"a {mesh.ndim}-D mesh needs mesh_dim_names (minidist.mesh's constants)")
        self.names: tuple[str, ...] = tuple(mesh.mesh_dim_names or (DP,))
        self._flat = dict(flattened or {})
        self._covers = {DP: tuple(n for n in self.names if n in (REPLICATE, SHARD))} if DP not in self.names else {}
        if CP in self.names:
            self._covers[DP_CP] = tuple(n for n in self.names if n in DATA_PARALLEL_DIMS + (CP,))
            self._covers |= {SHARD_CP: (SHARD, CP), REPLICATE_CP: (REPLICATE, CP)} if SHARD in self.names else {}

    # -- dimensions, by name -------------------------------------------------------------------
    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return self.names

    def root_dims(self, name: str) -> tuple[str, ...]:
        """The mesh dimensions `name` spans: itself, or (replicate, shard) for a flattened "dp", the
        data-parallel ones and cp for "dp_cp" ("dp"'s without cp); () for a dimension this layout
        does not have (size 1: tp in a data-parallel job)."""
        if name == DP_CP and CP not in self.names:
            return self.root_dims(DP)
        if name in self.names:
            return (name,)
        if name in self._covers:
            return self._covers[name]
        if name in DIM_ORDER:
            return ()
        raise ValueError(f"no mesh dimension {name!r}: this layout has {self.names} (and {DP!r})")

    @property
    def hybrid_dims(self) -> tuple[str, str]:
        """The 2-D mesh hybrid sharding spans (FSDP2's (replicate, shard)): under context parallelism the
        cp ranks joined to one of them (SHARD_CP or REPLICATE_CP, ParallelDims.cp_joins: they hold the same
        weights, so they shard or replicate with them)."""
        if CP not in self.names:
            return REPLICATE, SHARD
        two = [k for k in self._flat if isinstance(k, tuple)]
        if len(two) != 1:
            raise ValueError("a hybrid layout under cp has its 2-D engine mesh built by ParallelDims.build(); "
                             f"this one has {two or 'none'}")
        return two[0]

    def __getitem__(self, name: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh over `name` (a dimension, "dp", or a tuple of dimensions)."""
        if name in self._flat:
            return self._flat[name]
        if name == DP_CP and CP not in self.names:  # without context parallelism: the data-parallel ranks
            return self[DP]
        if isinstance(name, str) and self.root_dims(name) != (name,):
            raise ValueError(f"dimension {name!r} spans {self.root_dims(name)}: build the layout with "
                             f"ParallelDims.build() to have it flattened")
        return self.mesh[name]

    def size(self, name: str | None = None) -> int:
        """Ranks along `name` (1 for a dimension the layout does not have); None: the whole world."""
        if name is None:
            return self.mesh.size()
        return math.prod(self.mesh.size(self.names.index(d)) for d in self.root_dims(name))

    @property
    def device(self) -> torch.device:
        """Where this layout's collectives take their tensors (NCCL: the current GPU)."""
        t = self.mesh.device_type
        return torch.device(t, torch.cuda.current_device()) if t == "cuda" else torch.device(t)

    @property
    def coordinate(self) -> dict[str, int]:
        """This rank's index along every mesh dimension."""
        return dict(zip(self.names, self.mesh.get_coordinate()))

    @property
    def key(self) -> str:
        """The coordinate as a file-name part: "dp1", "replicate0_shard1", "dp0_tp1"."""
        return "_".join(f"{n}{c}" for n, c in self.coordinate.items())

    # -- the trainer's questions ---------------------------------------------------------------
    @property
    def dp_dims(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n in DATA_PARALLEL_DIMS)

    @property
    def dp_size(self) -> int:
        """How many different data shards the job reads: the product of the data-parallel dimensions."""
        return math.prod(self.size(n) for n in self.dp_dims)

    @property
    def dp_rank(self) -> int:
        """Which data shard this rank reads: its coordinate along the data-parallel dimensions, row-major.
        Ranks that differ only in pp, cp or tp read the same data (cp ranks keep different tokens of it)."""
        rank, coord = 0, self.coordinate
        for n in self.dp_dims:
            rank = rank * self.size(n) + coord[n]
        return rank

    @property
    def is_main(self) -> bool:
        """The one process that writes logs, plots and whole-model files: coordinate 0 on every dimension."""
        return not any(self.mesh.get_coordinate())

    @property
    def main_rank(self) -> int:
        """The main process's global rank (the source of what it decides for everyone)."""
        return int(self.mesh.mesh.flatten()[0])

    def all_reduce(self, tensor: torch.Tensor, over: tuple[str, ...] = (DP,), op=comm.ReduceOp.SUM) -> torch.Tensor:
        """Reduce `tensor` in place over the dimensions `over` (default: data parallel, so ranks that
        differ only in tp count once). One all_reduce over a flattened group where one covers them all."""
        dims = [d for name in over for d in self.root_dims(name)]
        if len(set(dims)) != len(dims):
            raise ValueError(f"dimensions {over} overlap: each rank would be counted twice")
        flat = [n for n, covered in self._covers.items() if n in self._flat and set(covered) == set(dims)]
        groups = [self._flat[flat[0]].get_group()] if len(dims) > 1 and flat else \
            [self.mesh.get_group(d) for d in dims if self.size(d) > 1]
        for group in groups:
            comm.all_reduce(tensor, op, group=group)
        return tensor


# ------------------------------------------------------------------ meshes for the engines' users
def data_parallel_mesh(topo: Topology) -> DeviceMesh:
    """A 1-D mesh over every rank of the job, dimension "dp"."""
    return init_device_mesh(topo.device.type, (topo.world_size,), mesh_dim_names=(DP,))


def hybrid_mesh(topo: Topology, shard: int) -> DeviceMesh:
    """A 2-D (N / shard) x shard mesh, dimensions ("replicate", "shard"); ranks of a row shard together.

    Rows are consecutive ranks, so with shard = ranks per node the shard group's
    all_gathers and reduce_scatters stay on the node's fast links and only the
    replicate all_reduce (1/shard of the bytes) crosses nodes.
    """
    dims = ParallelDims.infer(topo.world_size, shard=shard, hybrid=True, settings={SHARD: "hybrid_mesh: shard"})
    return init_device_mesh(topo.device.type, dims.shape, mesh_dim_names=dims.names)


def _layout(mesh: Layout | DeviceMesh) -> Layout:
    return mesh if isinstance(mesh, Layout) else Layout(mesh)


def dp_size(mesh: Layout | DeviceMesh) -> int:
    """Layout.dp_size of a layout or a mesh."""
    return _layout(mesh).dp_size


def dp_rank(mesh: Layout | DeviceMesh) -> int:
    """Layout.dp_rank of a layout or a mesh."""
    return _layout(mesh).dp_rank


def is_main(mesh: Layout | DeviceMesh) -> bool:
    """Layout.is_main of a layout or a mesh."""
    return _layout(mesh).is_main


def main_rank(mesh: Layout | DeviceMesh) -> int:
    """Layout.main_rank of a layout or a mesh."""
    return _layout(mesh).main_rank


def all_reduce_dp(tensor: torch.Tensor, mesh: Layout | DeviceMesh) -> torch.Tensor:
    """Sum `tensor` over every data-parallel rank, in place (Layout.all_reduce)."""
    return _layout(mesh).all_reduce(tensor)


def group_of(who: str, process_group, mesh: DeviceMesh | None):
    """The process group an engine that works over one dimension uses: `process_group`, or `mesh`'s only one.

    Engines accept either, as torch's do; a 2-D mesh must be sliced by name first
    (mesh["shard"]), so that which dimension an engine spans is always written down.
    """
    if mesh is None:
        return process_group
    if process_group is not None:
        raise ValueError(f"{who}: pass a process group or a mesh, not both")
    if mesh.ndim != 1:
        raise ValueError(f"{who} spans one mesh dimension, got a {mesh.ndim}-D mesh with dimensions "
                         f"{mesh.mesh_dim_names}; pass one of them, e.g. mesh[{(mesh.mesh_dim_names or ('dp',))[-1]!r}]")
    return mesh.get_group()
