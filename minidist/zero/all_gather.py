"""After step(): every rank's updated shard into every rank's parameters, one all_gather per bucket.

Each rank updated only its shard of each bucket; the all_gather's input is that
shard and its output the bucket's whole flat parameter buffer, of which the
model's parameters are views (bucket.py): the updated values land in the
parameters themselves, with no staging copy. S (N-1)/N bytes sent per rank,
one collective per bucket: alpha x buckets, where broadcasting each owner's
share (owner_broadcast.py) costs N collectives and, as a pipelined chain, about
S bytes per rank.

Overlap (``overlap_param_gather``, DeepSpeed's overlap_comm for this gather):
step() returns with the all_gathers in flight, launched in the order the next
forward needs them (the buckets hold parameters in reverse registration order,
so the last bucket first). A forward pre-hook on every module that holds
parameters waits for its buckets just before the module first runs: the gather
of later layers' parameters hides behind the forward of earlier ones. The rule
this relies on: a parameter is read inside the forward of a module that holds
it, or of one of its descendants called after it (true of nn.Linear, Embedding,
LayerNorm and of weight tying by assignment). Whatever was not waited for is
waited for when the next backward or step() starts.
"""

from __future__ import annotations

from typing import Iterable

import torch.nn as nn

from minidist.zero.bucket import ParamState, ZeroBucket


class ParamGather:
    """Launches the all_gathers after step() and decides when they are waited for."""

    def __init__(self, overlap: bool):
        self.overlap = overlap
        self._pending: list[ZeroBucket] = []
        self._handles = []

    def launch(self, buckets: list[ZeroBucket]) -> None:
        """Write each updated shard into flat_param and all_gather it; wait now unless overlapping."""
        self.wait_all()
        order = list(reversed(buckets))  # the first layers' parameters are in the last bucket
        for bucket in order:
            bucket.write_master()
        for bucket in order:
            bucket.launch_gather()
        self._pending = order
        if not self.overlap:
            self.wait_all()

    def wait_all(self) -> None:
        for bucket in self._pending:
            bucket.wait_gather()
        self._pending = []

    def attach(self, module: nn.Module, bucket_of: dict[int, ZeroBucket]) -> None:
        """Forward pre-hooks: each module waits for the buckets of the parameters it holds (not its children's)."""
        for m in module.modules():
            mine = _unique(bucket_of[id(p)] for p in m.parameters(recurse=False) if id(p) in bucket_of)
            if mine:
                self._handles.append(m.register_forward_pre_hook(self._hook_for(mine)))

    def _hook_for(self, buckets: list[ZeroBucket]):
        def wait_for_parameters(_module, _args):
            if self._pending:
                for bucket in buckets:
                    if bucket.param_state is ParamState.GATHERING:
                        bucket.wait_gather()
                self._pending = [b for b in self._pending if b.param_state is ParamState.GATHERING]
        return wait_for_parameters

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _unique(buckets: Iterable[ZeroBucket]) -> list[ZeroBucket]:
    out: list[ZeroBucket] = []
    for b in buckets:
        if all(b is not c for c in out):
            out.append(b)
    return out
