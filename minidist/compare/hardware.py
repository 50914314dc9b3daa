"""What the planner prices a layout on: a GPU cluster under NCCL's model, or this machine's calibrated link.

    Hardware("h100", nodes=16)                                   # 16 HGX H100 nodes, 400 Gb/s NIC per GPU
    Hardware(gpus_per_node=4, peak_flops=1e9, link=comm.calibrate())   # here: gloo, emulated compute

A cluster's calls are priced as NCCL would run them (minidist.compare.pricing: its algorithm and protocol
per call, tuning.cc's constants), its compute at the GPU's dense peak (minidist.precision.PEAK_FLOPS).
This machine has neither: its link is the alpha and beta minidist fits itself (comm.calibrate: timed
all_reduces, least squares), every call priced by the ring formula on it as gloo runs it, and its
"device" the GPT's emulated compute (model.emulate_flops_per_s, minidist.models.emulated), whose rate is
the peak. So the planner's order of step times can be checked against measured ones
(tests/compare/test_plan.py) with every rate measured or set, none fitted to the step times.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.comm.cost import CostModel
from minidist.comm.nccl_graphs import HopperNode
from minidist.compare import pricing
from minidist.precision import RunPrecision

GB = 1e9
DEVICE_GB = {"h100": 80.0, "h200": 141.0, "a100": 80.0}


@dataclass(frozen=True)
class Hardware:
    """A cluster: `nodes` of `gpus_per_node` GPUs of one type, a NIC of nic_Gbps per GPU (NCCL's model of an
    HGX node: minidist.comm.nccl_graphs.HopperNode; an A100's NVLink taken as Hopper's)."""

    gpu: str = "h100"
    gpus_per_node: int = 8
    nodes: int = 1
    nic_Gbps: float = 400.0
    memory_GB: float | None = None
    peak_flops: float | None = None
    """The device's dense peak FLOP/s at the run's precision; None: the GPU's (minidist.precision.PEAK_FLOPS).
    This machine under emulated compute: the GPT's emulate_flops_per_s (with efficiency 1)."""
    link: CostModel | None = None
    """A calibrated alpha-beta link (minidist.comm.calibrate: this machine's gloo) on which every call and transfer
    is priced (pricing.price_link), with the engines' own bucket sizes; None: NCCL's model of the node."""

    def peak(self, precision: RunPrecision) -> float:
        return self.peak_flops or precision.peak_flops(self.gpu)

    def price(self, calls: list) -> dict[str, float]:
        """Seconds per phase of `calls` (pricing.price's dict): on the link where there is one, else by NCCL."""
        return pricing.price_link(self.link, calls) if self.link else pricing.price(self.node(), calls)

    def send_s(self, nbytes: float, cross: bool) -> float:
        """One point-to-point transfer: on the link, alpha + S beta; else over the NIC (cross: between nodes) or
        NVLink, at 10 or 3 us of latency."""
        if self.link:
            return self.link.predict("send", int(nbytes), 2)
        return nbytes / ((self.nic_Gbps / 8 if cross else self.node().nvlink_GBps) * GB) + (10e-6 if cross else 3e-6)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def device_GB(self) -> float:
        return self.memory_GB or DEVICE_GB[self.gpu]

    def node(self) -> HopperNode:
        return HopperNode(name=self.gpu, gpus=self.gpus_per_node, nic_GBps=self.nic_Gbps / 8)
