"""NCCL's own cost model: the algorithm and protocol it runs a collective with, and the time it predicts.

    node = HopperNode()                                    # an 8-GPU HGX H100/H200 node, 8 x 400 Gb/s NICs
    c = predict("all_reduce", 25 * 2**20, ranks=1024, node=node)
    c.algorithm, c.protocol, c.seconds, c.bound            # 'ring', 'Simple', ..., 'latency'

Source: NVIDIA/nccl v2.30.7 (commit 5067397c2676d5aed50042fc39e5c8ee96eb0027). The numbers come
from src/graph/tuning.cc, ncclTopoTuneModel (per collective, algorithm and protocol a latency and a
bandwidth, from the table ncclTunerConstantsDefaults and nvlsEfficiency) and ncclTopoGetAlgoTime
(time = latency + bytes / bandwidth, with the tree correction table and the ring's plateau); the choice
from src/enqueue.cc, topoGetAlgoInfo (the smallest predicted time over every enabled pair, ties to
the first). Reimplemented from reading them; no code copied. Bytes are NCCL's nBytes: the whole
buffer (for all_gather and reduce_scatter the gathered one: ncclFuncMaxSendRecvCount).

Per channel, NCCL's model (us, GB/s; N ranks on n nodes, ppn = N / n):
    bus bw     channels x per-channel bw (intra-node while n <= 2, inter-node beyond), then per protocol:
               ring LL min(llMaxBw, 0.5 x), ring LL128 0.92 x (capped per channel), tree all_reduce
               0.92 x (capped), tree LL / 3.8, tree LL128 x 120/128 (7/9 on one node), a tree of
               pattern TREE x 0.85, NVLS 0.85 x (c-1)/c x 2 (all_reduce) of the intra bandwidth;
    algo bw    ring, and NVLS's all_reduce: bus bw x N / steps (steps: 2(N-1) all_reduce, N-1 gather and
               scatter, N otherwise); tree all_reduce: bus bw / 2; NVLS's and PAT's gather and scatter:
               the bus bw as it is;
    latency    base + ring: (steps - inter) x hop + inter x net hop (inter = 2(n-1) for all_reduce);
               tree: 2 ((ppn-1) hop + log2(n) net hop); broadcast/reduce rings: one hop;
    time       latency (x 1.4 for a multi-node ring Simple all_reduce past 64 B per channel and rank)
               + bytes / (1000 x algo bw x tree correction(size)).

Algorithms (the word "tree" means NCCL's double binary tree only): ring; tree (a chain inside each
node, a double binary tree between nodes: all_reduce only); nvls (NVLink SHARP through the NVSwitch,
one node: all_reduce, all_gather, reduce_scatter); nvls_tree (NVLS inside nodes, a tree between them:
all_reduce); pat (all_gather, reduce_scatter with one GPU per node). Not modelled: CollNet (in-network
reduction needs SHARP switches and NCCL's collnet plugin: off by default, collnetEnable = 0). Enable
rules as NCCL's: LL128 on Hopper when the GPU-NIC path is at most PXN and the intra-node one at most
NVB; NVLS only with NVSwitch multicast and >= 2 local GPUs, not across nodes without CollNet; nvls_tree
not on one node; PAT only with one rank per node. `algorithms` / `protocols` restrict like NCCL_ALGO /
NCCL_PROTO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minidist.comm.nccl_graphs import Graph, Graphs, HopperNode

__all__ = ["ALGORITHMS", "PROTOCOLS", "Choice", "Graph", "Graphs", "HopperNode", "candidates", "predict"]

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree", "pat")
"""In NCCL's order (NCCL_ALGO_TREE 0, RING 1, NVLS 4, NVLS_TREE 5, PAT 6): ties go to the first."""
PROTOCOLS = ("LL", "LL128", "Simple")
COLLECTIVES = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")

# tuning.cc, ncclTunerConstantsDefaults (us): baseLatencies and hwLatencies by (algorithm, protocol).
BASE_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
           "pat": (8.0, 8.0, 8.0)}
HOP_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25),
               "pat": (0, 0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
            "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9),
            "pat": (0, 0, 14)},
}
# Hopper's rows (compute capability 9.x) of llMaxBws, perChMax*Bws, indexed by nodes 1 / 2 / more (GB/s);
# llMaxBws between nodes is read by CPU vendor instead (Intel row 0, AMD row 1).
LL_MAX_GBPS = {"one_node": (141.0, 45.0, 35.0), "intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0)}
RING_LL128_MAX_GBPS = (36.7, 36.7, 36.7)
TREE_LL128_MAX_GBPS = (36.7, 36.7, 29.0)
TREE_MAX_GBPS = (38.7, 41.4, 36.0)
NVLS_TREE_MAX_GBPS = (0.0, 57.7, 45.5)
NVLS_EFFICIENCY = 0.85
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
"""getNetOverhead: per network post, x3 for Simple; a floor under a multi-node ring's per-hop latency."""
# ncclTopoGetAlgoTime's treeCorrectionFactor, by protocol, for sizes 64 B x 2^k (k = 0..22 used).
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) for one call, as NCCL's model prices it."""

    op: str
    nbytes: int
    ranks: int
    nodes: int
    algorithm: str
    protocol: str
    latency_s: float
    """The per-call latency term (after the ring plateau factor)."""
    algbw_Bps: float
    """The algorithm bandwidth the time divides bytes by (after the tree correction), bytes per second."""
    seconds: float = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "seconds", self.latency_s + self.nbytes / self.algbw_Bps)

    @property
    def bound(self) -> str:
        """"latency" where the latency term is the larger one, else "bandwidth"."""
        return "latency" if self.latency_s >= self.nbytes / self.algbw_Bps else "bandwidth"


def predict(op: str, nbytes: int, ranks: int, node: HopperNode | None = None, *, ppn: int | None = None,
            algorithms: tuple[str, ...] = ALGORITHMS, protocols: tuple[str, ...] = PROTOCOLS) -> Choice | None:
    """NCCL's choice for one `op` of `nbytes` (its nBytes: module docstring) among `ranks` GPUs; None at 1 rank.

    Ranks fill nodes of `node.gpus` (ppn = min(ranks, gpus)) unless `ppn` says how many sit on each node.
    """
    options = candidates(op, nbytes, ranks, node, ppn=ppn, algorithms=algorithms, protocols=protocols)
    if ranks > 1 and not options:
        raise ValueError(f"no algorithm and protocol of {algorithms} x {protocols} runs {op} at {ranks} ranks")
    return min(options, key=lambda c: c.seconds) if options else None  # min keeps the first of equals


def candidates(op: str, nbytes: int, ranks: int, node: HopperNode | None = None, *, ppn: int | None = None,
               algorithms: tuple[str, ...] = ALGORITHMS, protocols: tuple[str, ...] = PROTOCOLS) -> list[Choice]:
    """Every enabled (algorithm, protocol) for the call, in NCCL's order, with its predicted time."""
    if op not in COLLECTIVES:
        raise ValueError(f"NCCL's model prices {COLLECTIVES}, not {op!r}")
    node = node or HopperNode()
    ppn = ppn or min(ranks, node.gpus)
    if ranks % ppn or ppn > node.gpus:
        raise ValueError(f"{ranks} ranks do not fill nodes of {ppn} (a node has {node.gpus} GPUs)")
    if ranks <= 1:
        return []
    nodes = ranks // ppn
    graphs = node.graphs(nodes, ppn)
    out = []
    for algo in (a for a in ALGORITHMS if a in algorithms and _runs(op, a, node, nodes, ppn)):
        for p, proto in enumerate(PROTOCOLS):
            if proto not in protocols or not _protocol_enabled(algo, proto, node):
                continue
            bw = _algbw(op, algo, p, graphs, node, ranks, nodes)
            if bw <= 0:
                continue
            lat = _latency(op, algo, p, graphs, node, ranks, nodes)
            if algo == "ring" and proto == "Simple" and nodes > 1 and op == "all_reduce" \
                    and nbytes // (graphs.comm_channels * ranks) >= 64:
                lat *= 1.4  # "plateau effect of ring" (compute capability >= 8.0)
            k = int(math.log2(nbytes >> 6)) if nbytes >> 6 else -1
            if algo == "tree" and op == "all_reduce" and 0 <= k < 23:
                bw *= TREE_CORRECTION[proto][k]
            out.append(Choice(op, nbytes, ranks, nodes, algo, proto, lat * 1e-6, bw * 1e9))
    return out


def _runs(op: str, algo: str, node: HopperNode, nodes: int, ppn: int) -> bool:
    """Which algorithms NCCL tunes for `op` on this communicator (ncclTopoTuneModel, updateCollCostTable)."""
    if op in ("broadcast", "reduce"):
        return algo == "ring"
    nvls_ok = node.nvls and ppn >= 2
    if op in ("all_gather", "reduce_scatter"):
        return algo == "ring" or (algo == "nvls" and nvls_ok and nodes == 1) or (algo == "pat" and ppn == 1)
    return algo in ("ring", "tree") or (algo == "nvls" and nvls_ok and nodes == 1) or \
        (algo == "nvls_tree" and nvls_ok and nodes > 1)


def _protocol_enabled(algo: str, proto: str, node: HopperNode) -> bool:
    if algo in ("nvls", "nvls_tree", "pat") and proto != "Simple":
        return False
    return proto != "LL128" or node.ll128


def _algbw(op: str, algo: str, p: int, g: Graphs, node: HopperNode, ranks: int, nodes: int) -> float:
    """Algorithm bandwidth, GB/s (ncclTopoTuneModel's bandwidths[coll][algo][proto])."""
    graph = g[algo]
    col = min(nodes, 3) - 1
    ppn = ranks / nodes
    steps = 2 * (ranks - 1) if op == "all_reduce" else ranks - 1 if op in ("all_gather", "reduce_scatter") else ranks
    if algo in ("nvls", "nvls_tree"):
        if graph.channels < 2:
            return 0.0  # NVLS needs two channels at least
        intra = graph.bw_intra * NVLS_EFFICIENCY * (graph.channels - 1) / graph.channels
        intra *= 2.0 if op == "all_reduce" else (ppn - 1) / ppn
        inter = graph.bw_inter * (2 if nodes <= 2 and algo == "nvls_tree" else 1)
        per = min(intra, inter, NVLS_TREE_MAX_GBPS[col] if algo == "nvls_tree" else math.inf)
        return graph.channels * per * (ranks / steps if op == "all_reduce" else 1.0)  # no ratio for gather/scatter
    bus = graph.channels * (graph.bw_intra if nodes <= 2 else graph.bw_inter)
    ll_max = LL_MAX_GBPS["one_node" if nodes == 1 else node.cpu][col]
    if algo == "ring":
        bus = {0: min(ll_max, bus * .5), 1: min(bus * .92, graph.channels * RING_LL128_MAX_GBPS[col]), 2: bus}[p]
        return bus * ranks / steps
    if algo == "pat":
        return bus * .75  # taken as the algorithm bandwidth as it is (no bus-to-algorithm ratio)
    if op == "all_reduce":
        bus = min(bus * .92, graph.channels * TREE_MAX_GBPS[col])
    if p == 0:
        bus = min(bus / 3.8, ll_max)
    elif p == 1:
        bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), graph.channels * TREE_LL128_MAX_GBPS[col])
    if g.tree_pattern == "tree":
        bus *= .85
    return bus * .5


def _latency(op: str, algo: str, p: int, g: Graphs, node: HopperNode, ranks: int, nodes: int) -> float:
    """Per-call latency, us (ncclTopoTuneModel's latencies[coll][algo][proto])."""
    ppn = ranks / nodes
    graph = g[algo]
    hw = "nvlink" if nodes == 1 else "net"
    intra = HOP_US["nvlink"][algo][p]
    inter = HOP_US["net"]["tree" if ppn == 1 else algo][p] + graph.latency_inter_us * (2 if p == 2 else 1)
    lat = BASE_US[algo][p]
    if algo == "ring":
        steps = 2 * (ranks - 1) if op == "all_reduce" else ranks - 1 if op in ("all_gather", "reduce_scatter") else ranks
        if op in ("broadcast", "reduce"):
            hop = HOP_US[hw]["ring"][p] if graph.same_channels else \
                HOP_US[hw]["tree" if p == 2 else "ring"][p] * steps
            return lat + hop
        overhead = NET_OVERHEAD_US[node.cpu] * (3 if p == 2 else 1) if nodes > 1 else 0.0
        intra = max(intra, overhead)
        inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if op == "all_reduce" else nodes - 1
        return lat + (steps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return lat + (2 * ((ranks // nodes - 1) * intra + int(math.log2(nodes)) * inter) if op == "all_reduce" else 0)
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0)
    if algo == "nvls_tree":
        return lat + intra + 2 * int(math.log2(nodes)) * inter
    return lat + int(math.log2(nodes)) * (inter / 3.5) + ranks * 2.8  # pat


def table(node: HopperNode | None = None, ranks: tuple[int, ...] = (8, 64, 1024),
          sizes: tuple[int, ...] = (1 << 10, 1 << 20, 25 << 20, 1 << 30)) -> str:
    """NCCL's choice and predicted time per collective, size and rank count: what the docs quote."""
    node = node or HopperNode()
    lines = [f"NCCL's model (tuning.cc, v2.30.7) on {node.name}: {node.gpus} GPUs per node, NVLink "
             f"{node.nvlink_GBps:.1f} GB/s per GPU, a {node.nic_GBps * 8:.0f} Gb/s NIC per GPU; nBytes = whole buffer",
             f"{'op':<15}{'size':>8}" + "".join(f"{'N=' + str(n):>28}" for n in ranks)]
    for op in COLLECTIVES:
        for size in sizes:
            cells = []
            for n in ranks:
                c = predict(op, size, n, node)
                cells.append(f"{c.algorithm}/{c.protocol} {c.seconds * 1e6:,.0f} us {c.bound[0]}")
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            lines.append(f"{op:<15}{label:>8}" + "".join(f"{x:>28}" for x in cells))
    lines.append("algorithm/protocol, predicted time, l: latency-bound (latency >= bytes / bandwidth), b: bandwidth-bound")
    return "\n".join(lines)

