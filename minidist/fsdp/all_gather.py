"""One unit's all_gather: copy-in, ONE all_gather for all its parameters, copy-out.

    copy-in     local (S_local,) master dtype, storage device  ->  send (S_local,) param_dtype,
                compute device. Nothing to do when they agree: `local` is sent as it is.
    all_gather  every shard rank's send  ->  output (N S_local,), rank-major     S (N-1)/N sent per rank
    copy-out    output  ->  full (parameter-major; UnitShards.copy_out), then the output is dropped

(S = bytes of the unit's padded parameters, N S_local elements in param_dtype; N = ranks of
the shard group.) Per step, full_shard gathers each unit twice (forward, and again in
backward because it freed the parameters after forward) and reduces once: 3 S (N-1)/N,
1.5x DDP's 2 S (N-1)/N, less the unit whose forward ends last (the root, whose forward wraps
every other unit's, when it holds parameters; else the last unit): backward needs it first, so
it stays gathered, (3 S - S_root) (N-1)/N. shard_grad_op keeps the forward's
gather for backward: 2 S (N-1)/N. The padding rows travel too: S counts them.

One rank in the shard group (no_shard, or a world of one) in another dtype or on another
device: no collective, the "gather" is a cast of `local` straight into `full`.

start_all_gather is stateless: it returns an AllGather that owns what the collective still
needs (send buffer, output, Work or event); the unit that asked waits on it. On a GPU the
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
    """One unit's all_gather in flight; owns its send buffer and output until the copy-out."""

    def __init__(self, shards: UnitShards, send: torch.Tensor | None, output: torch.Tensor | None,
                 work: dist.Work | None, event, streams: Streams):
        self._shards, self._streams = shards, streams
        self._send, self._output, self._work, self._event = send, output, work, event

    @property
    def buffers(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(send buffer if it is a copy of `local`, output): what exists only for this collective."""
        send = None if self._send is None or self._send.data_ptr() == self._shards.local.data_ptr() else self._send
        return send, self._output

    def wait(self) -> None:
        """Wait for the all_gather, copy the output out into `full` (allocated now), drop send and output."""
        if self._work is not None:
            self._work.wait()
        self._streams.wait(self._event)
        if self._output is not None:
            self._shards.alloc_full()
            self._shards.copy_out(self._output)
            self._streams.wait_current(self._streams.all_gather)  # the copy-out was their last use
            for t in self.buffers:
                if t is not None:
                    free_storage(t)
        self._send = self._output = self._work = self._event = None


@torch.no_grad()
def start_all_gather(shards: UnitShards, mesh: MeshInfo, streams: Streams) -> AllGather:
    """Start gathering one unit's parameters from every rank of its shard group."""
    if mesh.shard_world == 1:
        shards.alloc_full()  # on the compute stream, which frees it
        with streams.on(streams.all_gather):
            shards.full.copy_(shards.local, non_blocking=True)
            return AllGather(shards, None, None, None, streams.record(streams.all_gather), streams)
    with streams.on(streams.all_gather):
        send = shards.gather_input()
        output = torch.empty(shards.padded, dtype=shards.param_dtype, device=shards.compute_device)
        work = comm.all_gather(output, send, group=mesh.shard_group, async_op=streams.async_op)
        return AllGather(shards, send, output, work, streams.record(streams.all_gather), streams)
