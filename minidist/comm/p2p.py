"""Point to point: one rank sends a tensor, one rank receives it (pipeline parallelism's only traffic).

    ops = [comm.P2POp(comm.isend, activation, group_peer=1, group=pp_group),
           comm.P2POp(comm.irecv, grad_buffer, group_peer=1, group=pp_group)]
    for work in comm.batch_isend_irecv(ops):       # posted together, in list order
        work.wait()

Unlike a collective, only the two ranks of a message take part: the sender's isend and the
receiver's irecv are matched by the order in which each side posts them (per peer and
`tag`; NCCL ignores tags), not by names, so two messages between the same ranks must be
posted in the same order on both sides or each lands in the other's buffer (tensors of the
same shape would even arrive silently swapped). minidist.pp.check proves that order for a
whole schedule before it runs.

Peers are group ranks (`group_peer`, as torch's P2POp), so an engine handed a mesh dimension
never touches a global rank; comm.global_rank converts for torch where it needs one.

Traced like every collective (minidist.comm.trace): one Record per op, op "send" (sent_bytes
= S, the tensor's bytes) or "recv" (0), group_size 2, and `group` the channel
"<group>:<src>><dst>" in group ranks, so that the k-th send of a channel on one rank and the
k-th receive of it on the other are the same message (trace.arrivals pairs them). Not in the
flight recorder: it numbers a group's collectives, which every member issues; a send has one
peer (minidist.pp's runtime names a receive that times out itself).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from minidist.comm import trace as _trace
from minidist.comm.groups import global_rank

Group = dist.ProcessGroup | None


def isend(tensor: torch.Tensor, group_dst: int, *, group: Group = None, tag: int = 0):
    """Send `tensor` to group rank `group_dst`; returns a Work (wait before changing `tensor`)."""
    return _post(P2POp(isend, tensor, group_dst, group, tag))[0]


def irecv(tensor: torch.Tensor, group_src: int, *, group: Group = None, tag: int = 0):
    """Receive into `tensor` from group rank `group_src`; returns a Work (wait before reading `tensor`)."""
    return _post(P2POp(irecv, tensor, group_src, group, tag))[0]


@dataclass(frozen=True)
class P2POp:
    """One half of a message: `op` is comm.isend or comm.irecv (torch's P2POp, peer as a group rank)."""

    op: Callable
    tensor: torch.Tensor
    group_peer: int
    group: Group = None
    tag: int = 0

    @property
    def is_send(self) -> bool:
        return self.op is isend


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list:
    """Post every op of the list, in order, as one batch (torch.distributed.batch_isend_irecv); one Work each.

    Posting is not completing: wait on a receive's Work before reading its tensor, and on a
    send's before the sent tensor changes or the process group is destroyed.
    """
    return _post(*p2p_op_list)


def _post(*ops: P2POp) -> list:
    if not ops:
        return []
    issued = time.perf_counter()
    torch_ops = [dist.P2POp(dist.isend if o.is_send else dist.irecv, o.tensor, group=o.group, tag=o.tag,
                            group_peer=o.group_peer) for o in ops]
    works = dist.batch_isend_irecv(torch_ops) if len(ops) > 1 else [_single(torch_ops[0])]
    if not _trace._ACTIVE:
        return works
    return [_trace.record("send" if o.is_send else "recv", o.tensor, o.tensor.numel(), o.group, w, issued,
                          channel=_channel(o)) for o, w in zip(ops, works)]


def _single(op: dist.P2POp):
    fn = dist.isend if op.op is dist.isend else dist.irecv
    peer = global_rank(op.group, op.group_peer)
    return fn(op.tensor, peer, group=op.group, tag=op.tag)


def _channel(op: P2POp) -> str:
    """"<group>:<src>><dst>" in group ranks: the same name on the sender and the receiver."""
    me = dist.get_rank(op.group)
    src, dst = (me, op.group_peer) if op.is_send else (op.group_peer, me)
    return f"{_trace._group_name(op.group)}:{src}>{dst}"
