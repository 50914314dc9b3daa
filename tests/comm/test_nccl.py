"""minidist.comm.nccl against NCCL's own model, computed by a literal transcription of tuning.cc.

The reference (tests/comm/nccl_tuning_cc.py) is NCCL's arithmetic in NCCL's shape, sharing no code
or table with the module. Both take the same input, what NCCL's topology search finds on the node
(the GRAPHS below, written as NCCL_DEBUG=INFO prints them, derived by hand from search.cc for an HGX
H100/H200 node with one 400 Gb/s NIC per GPU; the module derives its own and is checked to agree).
The table: every collective NCCL tunes x 1 KiB .. 1 GiB x 8 .. 1024 ranks of 8-GPU nodes, plus one
node's 2 and 4 GPUs and one GPU per node (PAT's case).
"""

from __future__ import annotations

import statistics

import pytest

from minidist.comm import nccl
from tests.comm import nccl_tuning_cc as cc

OPS = {"broadcast": cc.BROADCAST, "reduce": cc.REDUCE, "all_gather": cc.ALLGATHER,
       "reduce_scatter": cc.REDUCESCATTER, "all_reduce": cc.ALLREDUCE}
ALGOS = {cc.TREE: "tree", cc.RING: "ring", cc.NVLS: "nvls", cc.NVLS_TREE: "nvls_tree", cc.PAT: "pat"}
PROTOS = {cc.LL: "LL", cc.LL128: "LL128", cc.SIMPLE: "Simple"}
SIZES = [1 << k for k in range(10, 31, 2)]  # 1 KiB .. 1 GiB
SHAPES = [(n // 8, 8) for n in (8, 16, 32, 64, 128, 256, 512, 1024)] + [(1, 2), (1, 4), (8, 1), (64, 1), (1024, 1)]

# (nChannels, bwIntra, bwInter) per pattern, by communicator shape: NCCL's "Pattern p, ..., nChannels c,
# bw intra/inter" lines; comm channels after ncclTopoPostset; the tree's pattern.
GRAPHS = {
    "one node": {"ring": (12, 30.0, 30.0), "tree": (12, 30.0, 30.0), "comm_channels": 24},
    "nodes of 8": {"ring": (8, 48.0, 48.0), "tree": (8, 48.0, 48.0), "nvls": (8, 40.0, 48.0), "comm_channels": 16},
    "one per node": {"ring": (2, 24.0, 24.0), "tree": (2, 24.0, 24.0), "comm_channels": 4},
}
NVLS_ONE_NODE = {2: (2, 60.0, 60.0), 4: (4, 60.0, 60.0), 8: (8, 40.0, 60.0)}


def _shape_graphs(nodes: int, ppn: int) -> dict:
    if nodes == 1:
        return {**GRAPHS["one node"], "nvls": NVLS_ONE_NODE[ppn]}
    return GRAPHS["one per node" if ppn == 1 else "nodes of 8"]


def _comm(nodes: int, ppn: int) -> dict:
    """NCCL's ncclComm fields the model reads, for this shape, with the model tables filled in."""
    g = _shape_graphs(nodes, ppn)

    def graph(key, pattern):
        if key not in g:
            return {"nChannels": 0, "bwIntra": 0.0, "bwInter": 0.0, "typeIntra": cc.PATH_NVL, "typeInter": cc.PATH_PIX,
                    "latencyInter": 0.0, "sameChannels": 1, "pattern": pattern}
        c, intra, inter = g[key]
        return {"nChannels": c, "bwIntra": intra, "bwInter": inter, "typeIntra": cc.PATH_NVL,
                "typeInter": cc.PATH_PIX, "latencyInter": 0.0, "sameChannels": 0 if key == "nvls" else 1,
                "pattern": pattern}
    tree_pattern = cc.PATTERN_TREE if ppn == 1 and nodes > 1 else cc.PATTERN_BALANCED_TREE
    tree, nvls = graph("tree", tree_pattern), graph("nvls", cc.PATTERN_NVLS)
    graphs = [tree, graph("ring", cc.PATTERN_RING), graph("none", 0), graph("none", 0), nvls, nvls, tree]
    comm = {"nRanks": nodes * ppn, "nNodes": nodes, "localRanks": ppn, "minCompCap": 90, "maxCompCap": 90,
            "cpuArch": cc.CPU_ARCH_X86, "cpuVendor": cc.CPU_VENDOR_INTEL, "netDeviceType": cc.NET_DEVICE_HOST,
            "collnetEnable": 0, "collNetSupport": 0, "nvsCount": 1, "nvlsSupport": 1 if ppn >= 2 else 0,
            "maxTreePattern": tree_pattern, "nChannels": g["comm_channels"]}
    cc.tune_model(comm, graphs)
    return comm


def _table() -> list[tuple]:
    """(op, bytes, nodes, ppn, reference (algo, proto, us), module's Choice) for every case."""
    rows = []
    for nodes, ppn in SHAPES:
        comm = _comm(nodes, ppn)
        for op, coll in OPS.items():
            for size in SIZES:
                a, p, us = cc.choose(comm, coll, size)
                rows.append((op, size, nodes, ppn, (ALGOS[a], PROTOS[p], us),
                             nccl.predict(op, size, nodes * ppn, ppn=ppn)))
    return rows


TABLE = _table()


def test_the_module_derives_the_graphs_the_table_states():
    node = nccl.HopperNode()
    for nodes, ppn in SHAPES:
        mine, ref = node.graphs(nodes, ppn), _shape_graphs(nodes, ppn)
        for key in ("ring", "tree", "nvls"):
            got = getattr(mine, key)
            assert (None if got is None else (got.channels, got.bw_intra, got.bw_inter)) == ref.get(key), (nodes, ppn, key)
        assert mine.comm_channels == ref["comm_channels"]


def test_every_case_within_15_percent_of_nccls_model_and_the_same_choice():
    errors = []
    for op, size, nodes, ppn, (algo, proto, us), mine in TABLE:
        err = mine.seconds * 1e6 / us - 1
        errors.append(abs(err))
        assert abs(err) <= 0.15, (op, size, nodes * ppn, ppn, algo, proto, us, mine)
        assert (mine.algorithm, mine.protocol) == (algo, proto), (op, size, nodes * ppn, ppn, us, mine)
    print(f"\n{len(TABLE)} cases: max |error| {max(errors):.2e}, mean {statistics.mean(errors):.2e}")


def test_the_table_exercises_every_algorithm_and_protocol():
    """A table where NCCL always picked ring/Simple would check little."""
    chosen = {(r[4][0], r[4][1]) for r in TABLE}
    assert {"ring", "tree", "nvls", "nvls_tree", "pat"} <= {a for a, _ in chosen}
    assert {"LL", "LL128", "Simple"} <= {p for _, p in chosen}


def test_what_nccls_model_says_at_scale():
    """Known shapes of the model: latency-bound rings at 1024 ranks, the tree's log2 latency, LL for small calls."""
    rs = nccl.predict("reduce_scatter", 25 * 2**20, 1024)
    assert (rs.algorithm, rs.protocol, rs.bound) == ("ring", "LL128", "latency")
    # LL128: 14 us base + 896 NVLink hops of 1.9 us + 127 network hops of 4.0 us; 26 MB at 0.92 of 8 channels
    # x 48 GB/s, capped at 36.7 GB/s per channel
    assert rs.latency_s == pytest.approx((14.0 + 896 * 1.9 + 127 * 4.0) * 1e-6)
    assert rs.seconds == pytest.approx(rs.latency_s + 25 * 2**20 / (8 * 36.7e9 * 1024 / 1023))
    ar = nccl.predict("all_reduce", 25 * 2**20, 1024)
    assert ar.algorithm in ("tree", "nvls_tree") and ar.seconds < rs.seconds
    small = nccl.predict("all_reduce", 1024, 8)
    assert small.protocol == "LL" and small.bound == "latency"
    big = nccl.predict("all_reduce", 1 << 30, 8)
    assert (big.algorithm, big.bound) == ("nvls", "bandwidth")
    assert nccl.predict("all_reduce", 1 << 20, 1) is None


def test_restricting_like_nccl_algo_and_bad_input():
    ring = nccl.predict("all_reduce", 25 * 2**20, 1024, algorithms=("ring",))
    assert ring.algorithm == "ring" and ring.seconds > nccl.predict("all_reduce", 25 * 2**20, 1024).seconds
    assert all(c.protocol == "Simple" for c in nccl.candidates("all_reduce", 1 << 20, 64, protocols=("Simple",)))
    with pytest.raises(ValueError, match="all_to_all"):
        nccl.predict("all_to_all", 1024, 8)
    with pytest.raises(ValueError, match="fill nodes"):
        nccl.predict("all_reduce", 1024, 12, ppn=8)
    with pytest.raises(ValueError, match="no algorithm"):
        nccl.predict("broadcast", 1024, 16, algorithms=("tree",))
