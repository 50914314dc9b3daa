"""A literal transcription of NCCL's tuning arithmetic: the reference minidist.comm.nccl is checked against.

NVIDIA/nccl v2.30.7 (commit 5067397c2676d5aed50042fc39e5c8ee96eb0027):
src/graph/tuning.cc (ncclTunerConstantsDefaults, nvlsEfficiency, ncclTopoTuneModel, treeCorrectionFactor,
ncclTopoGetAlgoTime) and src/enqueue.cc (updateCollCostTable, topoGetAlgoInfo's minimum), written in
NCCL's shape on purpose: arrays indexed [coll][algo][proto] by NCCL's enum values, every compute
capability's row, the loops and branches in tuning.cc's order (CollNet's included, switched off as by
default), float32 where NCCL keeps floats. It shares no code or table with minidist.comm.nccl: a
formula checked against itself proves nothing. Environment overrides (NCCL_ALGO, NCCL_PROTO, ...),
tuner plugins and fp8 are left out (the defaults).
"""

from __future__ import annotations

import numpy as np

f32 = np.float32

# enums (nccl_common.h, plugin/nccl_tuner.h, graph.h)
BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLREDUCE = range(5)
NUM_FUNCTIONS = 5
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
NUM_ALGORITHMS = 7
LL, LL128, SIMPLE = range(3)
NUM_PROTOCOLS = 3
HW_NVLINK, HW_PCI, HW_NET = range(3)
VOLTA, AMPERE, HOPPER, BLACKWELL = range(4)
PATH_NVL, PATH_NVB, PATH_PIX, PATH_PXB, PATH_PXN = 1, 2, 4, 5, 7
LINK_NVL = 1
PATTERN_BALANCED_TREE, PATTERN_TREE, PATTERN_RING, PATTERN_NVLS = 1, 3, 4, 5
CPU_VENDOR_INTEL, CPU_VENDOR_AMD, CPU_VENDOR_MIXED = 1, 2, 4
CPU_ARCH_X86 = 1
NET_DEVICE_HOST = 0
MAX_NVLS_ARITY = 32
MAX_DIRECT_ARITY = 7

nvlsEfficiency = [0.0, 0.0, 0.85, 0.74]
baseLatencies = [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [8.0, 8.0, 8.0]]
hwLatencies = [
    [[0.6, 1.25, 4.0], [0.6, 1.9, 3.4], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 25], [0, 0, 25], [0, 0, 4.0]],  # NVLINK
    [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 0], [0, 0, 0], [0, 0, 4.0]],  # PCI
    [[5.0, 8.5, 14], [2.7, 4.0, 14.0], [0, 0, 31], [0, 0, 30], [0, 0, 18], [0, 0, 20.9], [0, 0, 14]],  # NET
]
llMaxBws = [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [2 * 141.0, 2 * 45.0, 2 * 35.0]]
perChMaxRingLL128Bws = [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 36.7], [40.0, 40.0, 40.0]]
perChMaxTreeLL128Bws = [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]]
perChMaxTreeBws = [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]]
perChMaxNVLSTreeBws = [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]]
treeCorrectionFactor = [
    [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0],
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9],
]


def log2i(n: int) -> int:
    return n.bit_length() - 1  # log2Down; -1 for 0


def getNetOverhead(comm) -> float:
    if comm["cpuArch"] == CPU_ARCH_X86 and comm["cpuVendor"] == CPU_VENDOR_INTEL:
        return 1.0
    if comm["cpuArch"] == CPU_ARCH_X86 and comm["cpuVendor"] == CPU_VENDOR_AMD:
        return 2.0
    return 1.0


def ncclPatEnable(comm) -> int:
    if comm["minCompCap"] < 60:
        return 0
    if comm["nNodes"] != comm["nRanks"]:
        return 0
    if comm["netDeviceType"] != NET_DEVICE_HOST:
        return 0
    return 1


def tune_model(comm, graphs):
    """ncclTopoTuneModel: comm["latencies"], comm["bandwidths"] [coll][algo][proto]. As in C, a float divided
    by zero (CollNet's branch with no CollNet graph) is inf or nan, zeroed by the enable matrix."""
    with np.errstate(divide="ignore", invalid="ignore"):
        _tune_model(comm, graphs)


def _tune_model(comm, graphs):
    lat_t = [[[0.0] * NUM_PROTOCOLS for _ in range(NUM_ALGORITHMS)] for _ in range(NUM_FUNCTIONS)]
    bw_t = [[[f32(0)] * NUM_PROTOCOLS for _ in range(NUM_ALGORITHMS)] for _ in range(NUM_FUNCTIONS)]
    comm["latencies"], comm["bandwidths"] = lat_t, bw_t
    nNodes, nRanks, minCompCap = comm["nNodes"], comm["nRanks"], comm["minCompCap"]
    compCapIndex = BLACKWELL if minCompCap >= 100 else HOPPER if minCompCap >= 90 else \
        AMPERE if minCompCap >= 80 else VOLTA
    index2 = nNodes - 1 if nNodes <= 2 else 2
    index1 = compCapIndex if nNodes == 1 else \
        1 if comm["cpuVendor"] in (CPU_VENDOR_AMD, CPU_VENDOR_MIXED) else 0
    llMaxBw = llMaxBws[index1][index2]
    perChMaxTreeBw = perChMaxTreeBws[compCapIndex][index2]
    perChMaxRingLL128Bw = perChMaxRingLL128Bws[compCapIndex][index2]
    perChMaxTreeLL128Bw = perChMaxTreeLL128Bws[compCapIndex][index2]
    perChMaxNVLSTreeBw = perChMaxNVLSTreeBws[compCapIndex][index2]
    ppn = f32(nRanks) / f32(nNodes)
    intraHw = [HW_NVLINK if graphs[a]["typeIntra"] == LINK_NVL else HW_PCI for a in range(NUM_ALGORITHMS)]
    hw = [intraHw[a] if nNodes == 1 else HW_NET for a in range(NUM_ALGORITHMS)]
    for coll in range(NUM_FUNCTIONS):
        nsteps = 2 * (nRanks - 1) if coll == ALLREDUCE else \
            nRanks - 1 if coll in (REDUCESCATTER, ALLGATHER) else nRanks
        for a in range(NUM_ALGORITHMS):
            if coll in (BROADCAST, REDUCE) and a != RING:
                continue
            if coll in (REDUCESCATTER, ALLGATHER) and a not in (PAT, RING, NVLS, COLLNET_DIRECT):
                continue
            if coll == ALLREDUCE and a == PAT:
                continue
            g = graphs[a]
            for p in range(NUM_PROTOCOLS):
                if a in (NVLS, NVLS_TREE) and p != SIMPLE:
                    continue
                if coll in (REDUCESCATTER, ALLGATHER) and a == PAT and (p != SIMPLE or ncclPatEnable(comm) == 0):
                    continue
                collnet = 1 if a in (COLLNET_DIRECT, COLLNET_CHAIN) else 0
                bw = f32(g["bwIntra"] if nNodes <= 2 or collnet else g["bwInter"])
                if a in (NVLS_TREE, NVLS):
                    if g["nChannels"] < 2:
                        continue
                    intraBw = f32(g["bwIntra"] * nvlsEfficiency[compCapIndex] * (g["nChannels"] - 1) / g["nChannels"])
                    if coll == ALLREDUCE:
                        intraBw *= f32(2.0)
                    else:
                        intraBw *= (ppn - 1) / ppn
                    interBw = f32(g["bwInter"] * (2 if nNodes <= 2 and a == NVLS_TREE else 1))
                    bw = f32(min(intraBw, interBw, perChMaxNVLSTreeBw if a == NVLS_TREE else np.finfo(np.float32).max))
                busBw = f32(g["nChannels"] * bw)
                if a == RING and p == LL:
                    busBw = f32(min(llMaxBw, busBw * .5))
                if a == RING and p == LL128:
                    busBw = f32(min(busBw * 0.92, g["nChannels"] * perChMaxRingLL128Bw))
                if a == TREE and coll == ALLREDUCE:
                    busBw = f32(min(busBw * .92, g["nChannels"] * perChMaxTreeBw))
                if a == TREE and p == LL:
                    busBw = f32(min(busBw * 1.0 / 3.8, llMaxBw))
                if a == TREE and p == LL128:
                    busBw = f32(min(busBw * (7.0 / 9.0 if nNodes == 1 else 120.0 / 128.0),
                                    g["nChannels"] * perChMaxTreeLL128Bw))
                if a == TREE and comm["maxTreePattern"] == PATTERN_TREE:
                    busBw *= f32(.85)
                if a == PAT:
                    busBw *= f32(.75)
                if a in (COLLNET_DIRECT, COLLNET_CHAIN) and p != SIMPLE:
                    busBw = f32(0)
                if a == COLLNET_DIRECT and p == SIMPLE:
                    if coll in (ALLGATHER, REDUCESCATTER):
                        busBw = f32(ppn * min(g["bwIntra"], g["bwInter"] * 0.9))
                    else:
                        factor = ppn / (1.0 * g["nChannels"])
                        factor -= (factor - 1) / 2
                        busBw /= f32(factor)
                        if minCompCap >= 90:
                            busBw *= f32(.85)
                if a in (NVLS, COLLNET_DIRECT) and p == SIMPLE and coll in (ALLGATHER, REDUCESCATTER) and nNodes > 1:
                    busBw = f32(0)  # no collnet plugin with iallgather / ireducescatter (collnetEnable == 0)
                if not (a != RING and coll in (ALLGATHER, REDUCESCATTER)):
                    ratio = 1.0
                    if a in (RING, NVLS, NVLS_TREE):
                        ratio *= (1.0 * nRanks) / nsteps
                    else:
                        ratio *= .5
                    busBw = f32(busBw * ratio)
                bw_t[coll][a][p] = busBw
                lat_t[coll][a][p] = baseLatencies[a][p]
                intraLat = hwLatencies[intraHw[a]][a][p]
                interLat = hwLatencies[HW_NET][TREE][p] if ppn == 1 else hwLatencies[HW_NET][a][p]
                interLat += g["latencyInter"]
                if p == SIMPLE:
                    interLat += g["latencyInter"]
                if a == RING:
                    lat = hwLatencies[hw[a]][a][p]
                    if coll in (REDUCE, BROADCAST):
                        if g["sameChannels"]:
                            lat_t[coll][a][p] += lat
                        else:
                            if p == SIMPLE:
                                lat = hwLatencies[hw[a]][TREE][p]
                            lat_t[coll][a][p] += nsteps * lat
                    else:
                        netOverhead = 0.0
                        if nNodes > 1:
                            netOverhead = getNetOverhead(comm)
                            if p == SIMPLE:
                                netOverhead *= 3
                        intraLat = max(intraLat, netOverhead)
                        nInterSteps = 0 if nNodes == 1 else 2 * (nNodes - 1) if coll == ALLREDUCE else nNodes - 1
                        lat_t[coll][a][p] += (nsteps - nInterSteps) * intraLat + nInterSteps * interLat
                elif a == TREE:
                    if coll == ALLREDUCE:
                        lat_t[coll][a][p] += 2 * ((nRanks // nNodes - 1) * intraLat + log2i(nNodes) * interLat)
                elif a == COLLNET_DIRECT:
                    lat_t[coll][a][p] += 2 * (min(1, nRanks // nNodes - 1) * intraLat
                                              + (nRanks // nNodes - 1) * 0.4) + interLat
                elif a == COLLNET_CHAIN:
                    lat_t[coll][a][p] += 2 * (nRanks // nNodes - 1) * intraLat + interLat
                elif a == NVLS:
                    lat_t[coll][a][p] = intraLat
                    if nNodes > 1:
                        lat_t[coll][a][p] += interLat
                elif a == NVLS_TREE:
                    lat_t[coll][a][p] += intraLat + 2 * log2i(nNodes) * interLat
                elif a == PAT:
                    if coll in (ALLGATHER, REDUCESCATTER):
                        lat_t[coll][a][p] += log2i(nNodes) * (interLat / 3.5) + nRanks * 2.8
    _enable(comm, graphs)


def _enable(comm, graphs):
    """The protocol and algorithm enable matrix (defaults: LL128 = 2, i.e. by the rules below)."""
    for c in range(NUM_FUNCTIONS):
        for a in range(NUM_ALGORITHMS):
            disable = 0
            if comm["nNodes"] == 1 and a == NVLS_TREE:
                disable = 1
            if comm["collnetEnable"] == 0 and (a in (COLLNET_DIRECT, COLLNET_CHAIN) or (a == NVLS and comm["nNodes"] > 1)):
                disable = 1
            if comm["nvsCount"] == 0 and a == COLLNET_DIRECT:
                disable = 1
            for p in range(NUM_PROTOCOLS):
                pEnable = 1
                if p == LL128:
                    if comm["minCompCap"] >= 90:  # NCCL_LL128_C2C default 1
                        pEnable &= graphs[a]["typeInter"] <= PATH_PXN
                    else:
                        pEnable &= graphs[a]["typeInter"] <= PATH_PXB
                    pEnable &= graphs[a]["typeIntra"] <= PATH_NVB
                    pEnable &= comm["minCompCap"] == comm["maxCompCap"] or comm["minCompCap"] >= 90
                    pEnable &= not (comm["minCompCap"] < 70)
                if pEnable == 0 or disable:
                    comm["bandwidths"][c][a][p] = f32(0)


def get_algo_time(comm, coll, algorithm, protocol, nBytes):
    """ncclTopoGetAlgoTime, us; -1 where the bandwidth is 0. One call (numPipeOps = 1: latCount = 1)."""
    bw = comm["bandwidths"][coll][algorithm][protocol]
    lat = f32(comm["latencies"][coll][algorithm][protocol])
    if bw == 0:
        return -1.0
    logSize = log2i(nBytes >> 6)
    if algorithm == TREE and coll == ALLREDUCE and 0 <= logSize < 23:
        bw = f32(bw * treeCorrectionFactor[protocol][logSize])
    if algorithm == NVLS_TREE and coll == ALLREDUCE and 0 <= logSize < 24 and comm["minCompCap"] >= 100 \
            and comm["cpuArch"] == CPU_ARCH_X86:
        bw = f32(bw * treeCorrectionFactor[protocol][logSize])
    if algorithm == RING and protocol == SIMPLE and comm["nNodes"] > 1 and coll == ALLREDUCE \
            and nBytes // (comm["nChannels"] * comm["nRanks"]) >= 64:
        lat = f32(lat * (1.9 if comm["minCompCap"] < 80 else 1.4))
    latCount = 1
    return float(f32(lat * latCount + nBytes / (1000 * bw)))


def choose(comm, coll, nBytes):
    """updateCollCostTable + topoGetAlgoInfo's loop: (algorithm, protocol, time us) of the fastest."""
    table = [[-1.0] * NUM_PROTOCOLS for _ in range(NUM_ALGORITHMS)]  # NCCL_ALGO_PROTO_IGNORE
    for a in range(NUM_ALGORITHMS):
        if a in (COLLNET_DIRECT, COLLNET_CHAIN) and comm["collNetSupport"] != 1:
            continue
        if a in (NVLS, NVLS_TREE) and (not comm["nvlsSupport"] or (coll != ALLREDUCE and comm["localRanks"] > MAX_NVLS_ARITY)):
            continue
        if a == NVLS and comm["collNetSupport"] != 1 and comm["nNodes"] > 1:
            continue
        for p in range(NUM_PROTOCOLS):
            table[a][p] = get_algo_time(comm, coll, a, p, nBytes)
    best, minTime = None, float(np.finfo(np.float32).max)
    for a in range(NUM_ALGORITHMS):
        for p in range(NUM_PROTOCOLS):
            if table[a][p] == -1.0:
                continue
            if 0.0 <= table[a][p] < minTime:
                best, minTime = (a, p), table[a][p]
    return best[0], best[1], minTime
