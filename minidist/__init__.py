"""minidist: data parallelism built from torch.distributed collectives.

Read in this order: runtime (who am I), comm (the collectives), ddp (all_reduce
of gradient buckets), zero (sharded optimizer state), fsdp (sharded parameters
on all_gather / reduce_scatter).
"""

from importlib.metadata import PackageNotFoundError, version

from minidist import comm, mesh, models, runtime
from minidist.ddp import DDP
from minidist.fsdp import FSDP
from minidist.runtime import Topology
from minidist.zero import ShardedOptimizer

try:
    __version__ = version("minidist")  # the installed distribution's metadata: pyproject.toml's version
except PackageNotFoundError:  # a checkout on sys.path, never installed
    __version__ = "0+unknown"

__all__ = ["__version__", "comm", "mesh", "models", "runtime", "Topology", "DDP", "ShardedOptimizer", "FSDP"]
