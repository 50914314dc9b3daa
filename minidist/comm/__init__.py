"""minidist.comm: the collectives, their trace, and their cost model.

    from minidist import comm
    comm.all_reduce(t)                       # stateless, delegates to torch.distributed
    with comm.trace() as tr: ...             # what was sent, how many bytes, how long
    model = comm.calibrate(); model.predict("all_reduce", S, N)
"""

from torch.distributed import ReduceOp

from minidist.comm.collectives import (
    FinishingWork,
    all_gather,
    all_reduce,
    all_reduce_coalesced,
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
from minidist.comm.trace import Record, Trace, ring_bytes_sent, trace

__all__ = [
    "ReduceOp", "FinishingWork", "all_gather", "all_reduce", "all_reduce_coalesced", "all_to_all", "barrier", "broadcast",
    "gather", "global_rank", "reduce", "reduce_scatter", "scatter", "CostModel", "calibrate", "Record", "Trace",
    "ring_bytes_sent", "trace",
]
