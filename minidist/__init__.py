"""minidist: data parallelism built from torch.distributed collectives.

Read in this order: runtime (who am I), comm (the collectives), ddp (all_reduce
of gradient buckets), zero (sharded optimizer state), fsdp (sharded parameters
on all_gather / reduce_scatter).
"""

from minidist import comm, runtime
from minidist.runtime import Topology

__all__ = ["comm", "runtime", "Topology"]

try:  # engines land one by one; the foundation works without them
    from minidist.ddp import DDP  # noqa: F401
    __all__.append("DDP")
except ImportError:
    pass
try:
    from minidist.zero import ShardedOptimizer  # noqa: F401
    __all__.append("ShardedOptimizer")
except ImportError:
    pass
try:
    from minidist.fsdp import FSDP  # noqa: F401
    __all__.append("FSDP")
except ImportError:
    pass
