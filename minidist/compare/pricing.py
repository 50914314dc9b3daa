"""A step's collectives priced on a GPU cluster as NCCL would run them, and the bucket size that keeps them cheap.

    t = call_time(node, call)                 # seconds: NCCL's algorithm and protocol for this call
    cost = price(node, calls)                 # seconds per phase, and the latency / bandwidth split
    bucket_bytes(node, ranks)                 # the gradient bucket at which latency stops dominating

Each Call (minidist.strategies: a strategy record's plan) is placed on nodes of node.gpus GPUs as the
projection places it (a group spanning `span` consecutive ranks touches ceil(span / G) nodes, with
group / nodes ranks on each) and priced by minidist.comm.nccl.predict: NCCL's own model
(tuning.cc), the algorithm and protocol it would choose, so "tree" here is NCCL's double binary tree.

Latency- or bandwidth-bound: each chosen call's time is latency + bytes / bandwidth; a set of calls is
latency-bound where the latency terms are the larger share of the sum.

The bucket rule (one place: the projection and the planner read it): a bucket of S bytes costs
lat + S / bw per call, so the share of a step's reduction spent in latency is lat / (lat + S / bw).
DeepSpeed's reduce_bucket_size (5e8 elements) is sized so that share stays small at the largest
scales; here it is derived from the cluster instead: the smallest power of two from DDP's 25 MiB
to 1 GiB at which NCCL's predicted reduce_scatter (ZeRO's and FSDP's call; DDP's all_reduce is
never slower to amortise) over `ranks` spends at most LATENCY_SHARE of its time in latency. On HGX H100
nodes with a 400 Gb/s NIC per GPU that is 64 MiB at 8 ranks, 128 MiB at 16, 512 MiB at 64 and the
1 GiB cap from 256 (tests/compare/test_plan.py): a ring's latency term grows with the ranks, its
bandwidth term does not.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

from minidist.comm import nccl
from minidist.comm.cost import CostModel
from minidist.comm.nccl_graphs import HopperNode
from minidist.strategies import Call

LATENCY_SHARE = 0.2
"""The bucket rule's ceiling on the latency share of one bucket's reduction."""
MIB = 2 ** 20
DEFAULT_BUCKET = 25 * MIB
"""DDP's (torch's) default bucket: the rule never goes below it."""
MAX_BUCKET = 1 << 30


def place(call: Call, gpus_per_node: int) -> tuple[int, int]:
    """(nodes the call's group touches, its ranks per node): consecutive ranks fill a node first."""
    nodes = max(1, -(-call.ranks_spanned // gpus_per_node))
    nodes = min(nodes, call.group_size)
    per = max(1, call.group_size // nodes)
    while call.group_size % per:  # a group that does not split evenly: the largest even split below
        per -= 1
    return call.group_size // per, per


@lru_cache(maxsize=65536)
def _choice(node: HopperNode, op: str, nbytes: int, ranks: int, ppn: int, algorithms: tuple[str, ...]):
    return nccl.predict(op, nbytes, ranks, node, ppn=ppn, algorithms=algorithms)


def choice(node: HopperNode, call: Call, algorithms: tuple[str, ...] = nccl.ALGORITHMS) -> nccl.Choice | None:
    """NCCL's choice for `call` (None for a group of one rank: nothing moves)."""
    if call.group_size <= 1:
        return None
    _, ppn = place(call, node.gpus)
    return _choice(node, call.op, int(call.payload), call.group_size, ppn, algorithms)


def call_time(node: HopperNode, call: Call, algorithms: tuple[str, ...] = nccl.ALGORITHMS) -> float:
    """Seconds for one call as NCCL would run it."""
    c = choice(node, call, algorithms)
    return 0.0 if c is None else c.seconds


def price(node: HopperNode, calls: list[Call], algorithms: tuple[str, ...] = nccl.ALGORITHMS) -> dict[str, float]:
    """Seconds per phase (forward, backward, after, critical, back to back), and the sums of the chosen
    calls' latency and bandwidth terms (latency_s, bandwidth_s)."""
    out = dict.fromkeys(("forward", "backward", "after", "critical", "latency_s", "bandwidth_s"), 0.0)
    for call, k in Counter(calls).items():  # equal buckets, TP's per-layer calls: priced once each
        c = choice(node, call, algorithms)
        if c is None:
            continue
        out[call.phase] += k * c.seconds
        out["latency_s"] += k * c.latency_s
        out["bandwidth_s"] += k * (c.seconds - c.latency_s)
    return out


def price_link(link: CostModel, calls: list[Call]) -> dict[str, float]:
    """price() on a calibrated alpha-beta link (minidist.comm.calibrate: this machine's gloo) instead of NCCL's
    model: each call by the ring formula (CostModel.predict), gloo's reduce_scatter as the all_reduce of the
    whole tensor it runs inside (twice the bytes), latency = the alpha terms."""
    out = dict.fromkeys(("forward", "backward", "after", "critical", "latency_s", "bandwidth_s"), 0.0)
    for call, k in Counter(calls).items():
        if call.group_size <= 1:
            continue
        op = "all_reduce" if call.op == "reduce_scatter" else call.op
        seconds, latency = link.predict(op, int(call.payload), call.group_size), link.predict(op, 0, call.group_size)
        out[call.phase] += k * seconds
        out["latency_s"] += k * latency
        out["bandwidth_s"] += k * (seconds - latency)
    return out


def bound(latency_s: float, bandwidth_s: float) -> str:
    """"latency" where the latency terms are the larger share, else "bandwidth" ("-" where nothing moves)."""
    if latency_s + bandwidth_s <= 0:
        return "-"
    return "latency" if latency_s >= bandwidth_s else "bandwidth"


def bucket_bytes(node: HopperNode, ranks: int, op: str = "reduce_scatter", share: float = LATENCY_SHARE) -> int:
    """The module docstring's rule: the smallest power-of-two bucket (>= 25 MiB, <= 1 GiB) whose reduction
    over `ranks` (filling nodes of node.gpus) spends at most `share` of its time in latency."""
    if ranks <= 1:
        return DEFAULT_BUCKET
    size = DEFAULT_BUCKET
    while size < MAX_BUCKET:
        c = choice(node, Call(op, size, ranks))
        if c.latency_s <= share * c.seconds:
            break
        size = min(MAX_BUCKET, 1 << math.ceil(math.log2(size + 1)))
    return size
