"""ParallelDims: how a world factors into named dimensions, checked, and the mesh built from them.

The degrees are checked against the world before any process group exists (a degree that
does not divide is one line naming the setting and its valid values); build() is the
collective that makes the DeviceMesh and the flattened groups a Layout answers from.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from minidist.mesh.layout import Layout
from minidist.mesh.names import CP, DP, DP_CP, PP, REPLICATE, REPLICATE_CP, SHARD, SHARD_CP, TP
from minidist.runtime import Topology


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
