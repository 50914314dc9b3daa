"""minidist.comm: the collectives, their trace, and their cost model.

    from minidist import comm
    comm.all_reduce(t)                       # stateless, delegates to torch.distributed
    comm.reduce_scatter_coalesced(outs, ins) # many tensors, one collective, each where it lies: coalesced.py
    comm.broadcast_tensors(params, group=g)  # every rank starts from group rank 0's values
    with comm.trace() as tr: ...             # what was sent, how many bytes, how long (and what "hidden" means)
    model = comm.calibrate(); model.predict("all_reduce", S, N)
    with comm.reduce_scatter_algorithm("ring"): ...   # or "native"; "auto" (default) picks by backend
    comm.set_debug(True)                     # ranks agree on every collective first (fingerprint.py)
    comm.flight_recorder.install_dump_handlers(run_dir)   # name a hang: flight_recorder.py
    with comm.kernel_io.written(group) as w: ...   # bytes the kernel saw this process write
    comm.batch_isend_irecv([comm.P2POp(comm.isend, t, group_peer=1, group=g)])   # point to point: p2p.py

Every call here that communicates is a collective, which every rank of its group must make, in the
same order: the collectives themselves, calibrate() (timed all_reduces and a broadcast; on one rank
alone it waits until the process group's timeout), kernel_io.written() (barriers), and set_debug()
(each rank's check is one more all_gather). The exception: isend, irecv and batch_isend_irecv
are point to point, made by the two ranks of each message only, in the same order on both.
"""

from torch.distributed import ReduceOp

from minidist.comm.collectives import (
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
from minidist.comm.fallbacks import FinishingWork
from minidist.comm.coalesced import all_gather_coalesced, all_reduce_coalesced, reduce_scatter_coalesced
from minidist.comm import flight_recorder, kernel_io
from minidist.comm.release import Handed
from minidist.comm.replicate import broadcast_tensors
from minidist.comm.p2p import P2POp, batch_isend_irecv, irecv, isend
from minidist.comm.cost import CostModel, calibrate
from minidist.comm.fingerprint import CollectiveMismatchError, set_debug
from minidist.comm.flight_recorder import CollectiveTimeoutError
from minidist.comm.ring import reduce_scatter_algorithm, ring_reduce_scatter, set_reduce_scatter_algorithm
from minidist.comm.trace import Record, Trace, collect_all, hidden_share, ring_bytes_sent, trace

__all__ = [
    "ReduceOp", "FinishingWork", "all_gather", "all_gather_coalesced", "all_reduce", "all_reduce_coalesced", "all_to_all", "barrier", "broadcast",
    "broadcast_tensors", "Handed",
    "gather", "global_rank", "reduce", "reduce_scatter", "reduce_scatter_coalesced", "scatter", "CostModel", "calibrate", "Record", "Trace",
    "ring_bytes_sent", "trace", "hidden_share", "collect_all", "reduce_scatter_algorithm", "ring_reduce_scatter", "set_reduce_scatter_algorithm",
    "flight_recorder", "kernel_io", "set_debug", "CollectiveMismatchError", "CollectiveTimeoutError",
    "P2POp", "batch_isend_irecv", "isend", "irecv",
]
