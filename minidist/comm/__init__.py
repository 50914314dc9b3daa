"""minidist.comm: the collectives, their trace, and their cost model.

    from minidist import comm
    comm.all_reduce(t)                       # stateless, delegates to torch.distributed
    with comm.trace() as tr: ...             # what was sent, how many bytes, how long
    model = comm.calibrate(); model.predict("all_reduce", S, N)
    with comm.reduce_scatter_algorithm("ring"): ...   # or "native"; "auto" (default) picks by backend
"""

from torch.distributed import ReduceOp

from minidist.comm.collectives import (
    FinishingWork,
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    gather,
    global_rank,
    reduce,
    reduce_scatter,
    scatter,
)
from minidist.comm.cost import CostModel, calibrate
from minidist.comm.ring import reduce_scatter_algorithm, ring_reduce_scatter, set_reduce_scatter_algorithm
from minidist.comm.trace import Record, Trace, ring_bytes_sent, trace

__all__ = [
    "ReduceOp", "FinishingWork", "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast",
    "gather", "global_rank", "reduce", "reduce_scatter", "scatter", "CostModel", "calibrate", "Record", "Trace",
    "ring_bytes_sent", "trace", "reduce_scatter_algorithm", "ring_reduce_scatter", "set_reduce_scatter_algorithm",
]
