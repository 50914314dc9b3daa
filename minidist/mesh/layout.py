"""Layout: a built DeviceMesh's named dimensions, the sub-meshes flattened from it, and this rank's place.

Every question the trainer asks of the job's parallel layout is answered here, never from
the global rank: which data shard is mine (dp_rank), how many the job reads (dp_size), who
writes files (is_main), over which ranks a loss or a norm is summed (all_reduce). A plain
mesh built elsewhere (data_parallel_mesh, hybrid_mesh) answers the same questions through
the module-level functions; group_of is how an engine that spans one dimension gets its group.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.mesh.names import CP, DATA_PARALLEL_DIMS, DIM_ORDER, DP, DP_CP, REPLICATE, REPLICATE_CP, SHARD, SHARD_CP


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


# ------------------------------------------------------------------ a plain mesh's answers
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
