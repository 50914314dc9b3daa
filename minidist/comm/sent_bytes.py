"""Bytes one rank sends per collective: the ring model's count, and what the backend really sends.

Every record of minidist.comm.trace carries the payload S (bytes of the *full* logical
tensor) and the bytes this rank sends under the ring model (``ring_bytes_sent``), N ranks:

    all_reduce                  2 S (N-1)/N
    all_gather, reduce_scatter    S (N-1)/N   (S = the full, unsharded tensor)
    all_to_all                    S (N-1)/N   (S = this rank's input)
    broadcast, reduce             S (N-1)/N   the MEAN over ranks: N-1 of the N ranks send S
                                              (a pipelined ring: all but the last; a tree: the
                                              inner nodes, some twice), one rank sends nothing
    scatter (src), gather (dst)   S (N-1)/N on the root, 0 elsewhere; gather: S/N off the root
    barrier                       0
    send, recv                    S on the sender, 0 on the receiver (point to point, comm.p2p:
                                  group_size 2, group = the channel "<group>:<src>><dst>")

Why a mean for broadcast and reduce: who sends how much depends on the algorithm (gloo's
broadcast is a binomial tree: the root sends 2S at N = 4), but every algorithm delivers S to
N-1 ranks, so all ranks' bytes add up to S (N-1) whatever it is: summed or averaged over ranks
the trace equals what the kernel counts; rank by rank it may not. What the backend really sends
is recorded beside (wire_op, wire_bytes: ``backend_bytes``): gloo's own reduce_scatter is an
all_reduce inside, 2 S (N-1)/N (minidist.comm.ring's sends S (N-1)/N; `algorithm` says which
ran); gloo's reduce is a ring reduce_scatter then a gather to the root, S (N-1)/N + S (N-1)/N^2
on average. Checked against the kernel's byte counters: tests/comm/test_kernel_io.py,
tests/compare/test_kernel_bytes.py.
"""

from __future__ import annotations


def ring_bytes_sent(op: str, payload: int, world: int, *, is_root: bool = False) -> int:
    """Bytes one rank sends for `op` on `payload` bytes among `world` ranks (broadcast, reduce: the mean)."""
    if world <= 1:
        return 0
    if op == "all_reduce":
        return 2 * payload * (world - 1) // world
    if op in ("all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"):
        return payload * (world - 1) // world
    if op == "scatter":
        return payload * (world - 1) // world if is_root else 0
    if op == "gather":
        return 0 if is_root else payload // world
    if op in ("barrier", "recv"):
        return 0
    if op == "send":
        return payload
    raise ValueError(f"unknown collective {op!r}")


def backend_bytes(op: str, algorithm: str, backend: str, payload: int, world: int,
                  is_root: bool = False) -> tuple[str, int]:
    """(the collective the backend runs, the bytes this rank sends for it): see the module docstring."""
    if backend == "gloo" and algorithm == "native" and op == "reduce_scatter":
        return "all_reduce", ring_bytes_sent("all_reduce", payload, world)
    if backend == "gloo" and op == "reduce" and world > 1:
        return "reduce", payload * (world - 1) // world + payload * (world - 1) // world ** 2
    return op, ring_bytes_sent(op, payload, world, is_root=is_root)
