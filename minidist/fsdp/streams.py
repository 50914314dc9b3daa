"""Where FSDP's collectives run, and how their users wait for them: CUDA streams and events, or gloo's threads.

On a GPU (FSDP2's design, _fsdp_param_group.FSDPCommContext): the all_gathers run on
their own stream, the reduce_scatters on another, hybrid_shard's replica all_reduces on
a third, so that communication overlaps the compute on the current (default) stream.
Ordering is by events, never by blocking the host:

    producer   side.wait_stream(current)      the side stream starts after what is queued
               with side: collective(...)     (a synchronous call: NCCL's stream is joined
               event = side.record_event()     back into `side` when the collective ends)
    consumer   current.wait_event(event)      the compute stream waits for the result

Memory is freed only when the collective that read it is done. A tensor allocated on
a side stream (a cast send buffer) goes back to that stream's pool when dropped, so
before dropping it, the side stream is made to wait for the current stream's last use
(wait_current); a tensor allocated on the current stream (a gradient being reduced) is
dropped only after the current stream has waited for the collective's event.

On the CPU (gloo) there are no streams: collectives are issued with async_op=True, run
on gloo's threads (minidist's ring reduce_scatter on its own thread), and the Work
handle is waited on. Every function here is then a no-op, so the FSDP code has one
shape for both.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class Streams:
    """One FSDP model's side streams (CUDA), or nothing (CPU). Shared by its units."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:  # high priority, as FSDP2: copies and collectives should not queue behind compute
            self.all_gather = torch.cuda.Stream(device, priority=-1)
            self.reduce_scatter = torch.cuda.Stream(device, priority=-1)
            self.all_reduce = torch.cuda.Stream(device)
        else:
            self.all_gather = self.reduce_scatter = self.all_reduce = None

    @property
    def async_op(self) -> bool:
        """gloo: asynchronous Work handles. CUDA: synchronous calls inside a side stream."""
        return not self.cuda

    @contextlib.contextmanager
    def on(self, stream, after=None) -> Iterator[None]:
        """Run the block on `stream`, started after everything queued on `after` (default: the current stream)."""
        if not self.cuda:
            yield
            return
        stream.wait_stream(after or torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            yield

    def record(self, stream=None):
        """An event marking the work queued so far on `stream` (default: the current one); None on CPU."""
        if not self.cuda:
            return None
        return (stream or torch.cuda.current_stream()).record_event()

    def wait(self, event) -> None:
        """Make the current stream wait for `event` (host not blocked)."""
        if event is not None:
            torch.cuda.current_stream().wait_event(event)

    def wait_current(self, stream) -> None:
        """Make `stream` wait for the current stream: what it allocated may be dropped after this."""
        if self.cuda:
            stream.wait_event(torch.cuda.current_stream().record_event())

    @staticmethod
    def done(event) -> bool:
        """Whether the work before `event` has finished (never blocks)."""
        return event is None or event.query()
