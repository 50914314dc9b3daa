"""Point to point: one rank sends a tensor, one rank receives it (ring attention's and pipelines' traffic).

    ops = [comm.P2POp(comm.isend, kv, group_peer=right, group=g),
           comm.P2POp(comm.irecv, kv_next, group_peer=left, group=g)]
    for work in comm.batch_isend_irecv(ops):       # posted together, in list order
        work.wait()

Only the two ranks of a message take part, not the whole group: a send is matched with the
receive its peer posts in the same order (per peer and tag), so two messages between the same
two ranks must be posted in the same order on both. Peers are group ranks (`group_peer`, as in
torch's P2POp), so code handed a mesh dimension never names a global rank.

Traced as the collectives are (minidist.comm.trace): one Record per op, "send" (sent_bytes: the
tensor's bytes) or "recv" (0), group_size 2, and as its group the channel "<group>:<src>><dst>"
in group ranks, the same name on both ends, so that the k-th send of a channel and the k-th
receive of it are the same message. Not in the flight recorder, which numbers a group's
collectives (every member issues each one; a message has two ends only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from minidist.comm import trace as _trace
from minidist.comm.groups import Group


def isend(tensor: torch.Tensor, group_dst: int, *, group: Group = None, tag: int = 0):
    """Send `tensor` to group rank `group_dst`; returns a Work (wait on it before changing `tensor`)."""
    return batch_isend_irecv([P2POp(isend, tensor, group_dst, group, tag)])[0]


def irecv(tensor: torch.Tensor, group_src: int, *, group: Group = None, tag: int = 0):
    """Receive into `tensor` from group rank `group_src`; returns a Work (wait on it before reading `tensor`)."""
    return batch_isend_irecv([P2POp(irecv, tensor, group_src, group, tag)])[0]


@dataclass(frozen=True)
class P2POp:
    """One end of a message: `op` is comm.isend or comm.irecv, `group_peer` the other end's group rank."""

    op: Callable
    tensor: torch.Tensor
    group_peer: int
    group: Group = None
    tag: int = 0

    @property
    def is_send(self) -> bool:
        return self.op is isend


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list:
    """Post every op of the list, in order (torch.distributed.batch_isend_irecv); one Work per op.

    Posting is not completing: wait on a receive's Work before reading its tensor, and on a
    send's before the tensor changes or the process group is destroyed.
    """
    if not p2p_op_list:
        return []
    issued = time.perf_counter()
    ops = [dist.P2POp(dist.isend if o.is_send else dist.irecv, o.tensor, group=o.group, tag=o.tag,
                      group_peer=o.group_peer) for o in p2p_op_list]
    works = dist.batch_isend_irecv(ops)
    if not _trace._ACTIVE:
        return works
    return [_trace.record("send" if o.is_send else "recv", o.tensor, o.tensor.numel(), o.group, w, issued,
                          channel=channel(o)) for o, w in zip(p2p_op_list, works)]


def channel(op: P2POp) -> str:
    """"<group>:<src>><dst>" in group ranks: the name both ends of the message give it."""
    me = dist.get_rank(op.group)
    src, dst = (me, op.group_peer) if op.is_send else (op.group_peer, me)
    return f"{_trace._group_name(op.group)}:{src}>{dst}"
