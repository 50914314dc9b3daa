"""What NCCL's topology search finds on a node: the input of its cost model (minidist.comm.nccl).

Before it prices anything, NCCL searches the node's topology for channels (src/graph/search.cc,
ncclTopoCompute, of NVIDIA/nccl v2.30.7, commit 5067397c2676d5aed50042fc39e5c8ee96eb0027): for
each algorithm's pattern (ring, balanced tree, NVLS) how many channels and how many GB/s each
channel may carry inside the node and across the network. NCCL_DEBUG=INFO prints the result:

    Pattern 4, crossNic 0, nChannels 8, bw 48.000000/48.000000, type NVL/PIX, sameChannels 1

Graph holds one such line (nChannels, bw intra/inter); Graphs the set for one communicator. Measured
on a real cluster, pass those. HopperNode derives them for an HGX H100/H200 node (8 GPUs on NVSwitch,
18 NVLink 4 links of 20.6 GB/s each: topo.h SM90_NVLINK_BW; one NIC per GPU behind a PCIe Gen5 switch,
which NCCL rates 48 GB/s) by following search.cc by hand, not by running it:

  * one node (ring and tree): the first largest channels x speed within the GPU's NVLink bandwidth
    (370.8 GB/s) over sm90SpeedArrayIntra (60, 50, 40, 30, ...; stop below 0.49 of the best): 6 x 60;
    ncclTopoDupChannels doubles channels at half the speed (speed >= 25, not Hopper's "< 50 with more
    than 4 channels"): 12 x 30; pass 2 cannot raise it (12 x 40 > 370.8);
  * several nodes, ppn GPUs per node: sm90SpeedArrayInter from the path's bottleneck (min(NIC, PCIe)
    = 48 for 400 Gb/s), one channel per GPU's NIC: ppn x 48 (8 x 48 = 384 >= 370.8 ends the search);
    doubled at half speed where ppn <= 4; the tree (balanced, BALANCED_TREE) the same; with one GPU
    per node the tree pattern is TREE (its bandwidth x 0.85 in tuning.cc);
  * NVLS, c = ppn channels (one head each): every channel loads every GPU's NVLink once and its head
    once more, (c + 1) x speed <= 370.8: 8 x 40 on a full node; pass 2 raises the inter speed
    (the NVSwitch side on one node, the NIC across nodes) while below twice the intra one: 60 on one
    node (sm90SpeedArrayIntra's top), 48 across nodes;
  * the communicator's channel count (for the ring's plateau, tuning.cc): twice the ring's
    (ncclTopoPostset), twice again across nodes on Hopper when a ring channel carries > 45 GB/s
    and fewer than 16 (connect.cc).
"""

from __future__ import annotations

from dataclasses import dataclass

SPEEDS_INTRA_SM90 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SPEEDS_INTER_SM90 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)


@dataclass(frozen=True)
class Graph:
    """One algorithm's channels (NCCL's "nChannels N, bw intra/inter" line), GB/s per channel."""

    channels: int
    bw_intra: float
    bw_inter: float
    same_channels: bool = True
    latency_inter_us: float = 0.0
    """The network plugin's latency property (InfiniBand's: 0)."""


@dataclass(frozen=True)
class Graphs:
    """The search's result for one communicator: a Graph per algorithm (nvls_tree uses nvls's, pat tree's)."""

    ring: Graph
    tree: Graph
    nvls: Graph | None
    comm_channels: int
    """The communicator's channels after ncclTopoPostset (used by the ring's plateau rule)."""
    tree_pattern: str = "balanced_tree"
    """"tree" (all NIC traffic through one GPU) costs the tree x 0.85 in tuning.cc."""

    def __getitem__(self, algorithm: str) -> Graph:
        graph = {"ring": self.ring, "tree": self.tree, "pat": self.tree, "nvls": self.nvls,
                 "nvls_tree": self.nvls}[algorithm]
        if graph is None:
            raise ValueError(f"no {algorithm} graph on this communicator")
        return graph


@dataclass(frozen=True)
class HopperNode:
    """An HGX H100/H200-class node: 8 GPUs on NVSwitch (NVLink 4), a 400 Gb/s NIC per GPU."""

    name: str = "hgx-h100"
    gpus: int = 8
    nvlink_GBps: float = 18 * 20.6
    """Per GPU: 18 NVLink 4 links of SM90_NVLINK_BW (topo.h)."""
    nic_GBps: float = 50.0
    """Per NIC: 400 Gb/s."""
    pcie_GBps: float = 48.0
    """GPU-NIC path bottleneck as NCCL rates PCIe Gen5 x16."""
    cpu: str = "intel"
    """getNetOverhead and llMaxBws between nodes depend on it (intel, amd)."""
    nvls: bool = True
    """NVSwitch multicast (NVLink SHARP): NCCL_NVLS_ENABLE's default where the driver reports it."""
    ll128: bool = True
    """Hopper enables LL128 up to a PXN GPU-NIC path and an NVB intra-node one (here PIX and NVL)."""

    def graphs(self, nodes: int, ppn: int) -> Graphs:
        """The search's result for `nodes` x `ppn` ranks (module docstring)."""
        if nodes == 1:
            ring = _dup(*_best_intra(self.nvlink_GBps))
        else:
            top = next(s for s in SPEEDS_INTER_SM90 if s <= min(self.nic_GBps, self.pcie_GBps))
            ring = _dup(ppn, top)
        nvls = self._nvls(nodes, ppn) if self.nvls and ppn >= 2 else None
        channels = 2 * ring.channels
        if nodes > 1 and ring.bw_intra > 45.0 and channels < 16:
            channels *= 2
        return Graphs(ring, ring, nvls, channels, "tree" if ppn == 1 and nodes > 1 else "balanced_tree")

    def _nvls(self, nodes: int, ppn: int) -> Graph:
        speeds = SPEEDS_INTRA_SM90 if nodes == 1 else SPEEDS_INTER_SM90
        top = 0 if nodes == 1 else next(k for k, s in enumerate(speeds) if s <= min(self.nic_GBps, self.pcie_GBps))
        intra = next(s for s in speeds[top:] if (ppn + 1) * s <= self.nvlink_GBps)
        k = speeds.index(intra)
        while k > top and speeds[k] < 2 * intra:  # pass 2 raises the inter speed alone, no faster than the NIC
            k -= 1
        return Graph(ppn, intra, speeds[k], same_channels=False)


def _best_intra(total: float) -> tuple[int, float]:
    """(channels, speed) of the first largest channels x speed <= total, stopping below 0.49 of the best speed."""
    best = (0, 0.0)
    for s in SPEEDS_INTRA_SM90:
        if best[0] and s / best[1] <= .49:
            break
        c = int(total // s)
        if c * s > best[0] * best[1]:
            best = (c, s)
    return best


def _dup(channels: int, speed: float) -> Graph:
    """ncclTopoDupChannels: twice the channels at half the speed, except where Hopper keeps them."""
    if speed < 25.0 or (speed < 50.0 and channels > 4):
        return Graph(channels, speed, speed)
    return Graph(2 * channels, speed / 2, speed / 2)
