"""One unit's all_gather: copy-in, then ONE collective that lands every parameter in `full`.

    copy-in     local (S_local,) master dtype, storage device  ->  send (S_local,) param_dtype,
                compute device. Nothing to do when they agree: `local` is sent as it is.
    all_gather  each parameter's padded shard (a piece of send)  ->  its (N c C,) region of
                `full`, rank r's rows at r c C: parameter-major, the compute layout, as one
                coalesced collective (comm.all_gather_coalesced)     S (N-1)/N sent per rank

(S = bytes of the unit's padded parameters, N S_local elements in param_dtype; N = ranks of
the shard group.) Per step, full_shard gathers each unit twice (forward, and again in
backward because it freed the parameters after forward) and reduces once: 3 S (N-1)/N,
1.5x DDP's 2 S (N-1)/N, less the unit whose forward ends last (the root, whose forward wraps
every other unit's, when it holds parameters; else the last unit): backward needs it first, so
it stays gathered, (3 S - S_root) (N-1)/N. shard_grad_op keeps the forward's
gather for backward: 2 S (N-1)/N. The padding rows travel too: S counts them.

Why coalesced, not one all_gather into a rank-major buffer and a copy-out (FSDP2's way, and
minidist's before): an all_gather lays rank 0's whole send buffer, then rank 1's, so a
parameter's rows from different ranks are not adjacent and the output must be rearranged,
one pass over S_unit on the caller's thread, the thread that computes. Given each
parameter's piece and region, gloo gathers into a flat buffer of its own and copies every
piece to its place on its worker thread, while the caller's thread goes on computing
(benchmarks/fsdp_vs_torch.py --mode overlap measures what stays exposed); NCCL runs one
all_gather per parameter in one group, straight into `full`. `full` is allocated when the gather starts, so a unit
gathering holds S_unit, as the output buffer did, and no moment holds both.

One rank in the shard group (no_shard, or a world of one) in another dtype or on another
device: no collective, the "gather" is a cast of `local` straight into `full`.

start_all_gather is stateless: it returns an AllGather that owns what the collective still
needs (send buffer, Work or event); the unit that asked waits on it. On a GPU the
copy-in and the all_gather run on the all_gather stream (minidist.fsdp.streams) and wait()
orders the compute stream after them by an event; on gloo the Work is waited on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm
from minidist.fsdp.shard_spec import MeshInfo
from minidist.fsdp.param import UnitShards, free_storage
from minidist.fsdp.streams import Streams


class AllGather:
    """One unit's all_gather in flight; owns its send buffer until the collective is done."""

    def __init__(self, shards: UnitShards, send: torch.Tensor | None, work: dist.Work | None, event,
                 streams: Streams):
        self._shards, self._streams = shards, streams
        self._send, self._work, self._event = send, work, event

    @property
    def buffers(self) -> list[torch.Tensor]:
        """What exists only for this collective: the send buffer, when it is a cast or copy of `local`."""
        own = self._send is not None and self._send.data_ptr() != self._shards.local.data_ptr()
        return [self._send] if own else []

    def wait(self) -> None:
        """Wait for the all_gather (`full` is filled when it is done), drop the send buffer."""
        if self._work is not None:
            self._work.wait()
        self._streams.wait(self._event)
        self._streams.wait_current(self._streams.all_gather)  # the collective was the send buffer's last use
        for t in self.buffers:
            free_storage(t)
        self._send = self._work = self._event = None


@torch.no_grad()
def start_all_gather(shards: UnitShards, mesh: MeshInfo, streams: Streams) -> AllGather:
    """Start gathering one unit's parameters from every rank of its shard group, straight into `full`."""
    shards.alloc_full()  # on the compute stream, which frees it
    with streams.on(streams.all_gather):
        if mesh.shard_world == 1:
            shards.full.copy_(shards.local, non_blocking=True)
            return AllGather(shards, None, None, streams.record(streams.all_gather), streams)
        send = shards.gather_input()
        inputs, outputs = shards.gather_pieces(send)
        if not inputs:  # every parameter empty: nothing to gather (the same on every rank)
            return AllGather(shards, send, None, None, streams)
        work = comm.all_gather_coalesced(outputs, inputs, group=mesh.shard_group, async_op=streams.async_op)
        return AllGather(shards, send, work, streams.record(streams.all_gather), streams)
