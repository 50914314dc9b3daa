"""The alpha-beta cost model of collectives, and a calibration that measures alpha and beta.

A message of b bytes costs alpha + b * beta: alpha is the per-message latency
(seconds), beta the inverse bandwidth (seconds per byte). For N ranks and a
payload of S bytes (the full logical tensor, as in minidist.comm.trace):

    op              ring                                   tree / recursive halving-doubling
    all_reduce      2(N-1) a + 2 S (N-1)/N b               2 log2(N) a + 2 S (N-1)/N b   (Rabenseifner)
    all_gather      (N-1) a  +   S (N-1)/N b               log2(N) a   +   S (N-1)/N b   (recursive doubling)
    reduce_scatter  (N-1) a  +   S (N-1)/N b               log2(N) a   +   S (N-1)/N b   (recursive halving)
    broadcast       (N-1) a  +   S b         (pipelined)   log2(N) (a + S b)             (binomial tree)
    reduce          (N-1) a  +   S b         (pipelined)   log2(N) (a + S b)
    gather, scatter (N-1) a  +   S (N-1)/N b               log2(N) a   +   S (N-1)/N b
    all_to_all      (N-1) a  +   S (N-1)/N b               log2(N) a   + S/2 log2(N) b     (Bruck)
    barrier         2(N-1) a                               log2(N) a                     (dissemination)
    send            a + S b (one message, one hop; recv: its other end, 0)

The ring's bandwidth term for all_reduce tends to 2 S b whatever N is; its latency term grows as N.
The "tree" column of all_reduce, all_gather and reduce_scatter is recursive halving/doubling: the
ring's bandwidth term with log2(N) latencies, so in this model it is never slower than the ring at a
power-of-two N. What makes real systems send large messages round rings is outside the model (each
halving/doubling step talks to a partner 2^k ranks away, over links a ring never shares; N must be
a power of two). Only for broadcast and reduce does the tree pay in bandwidth: a binomial tree
forwards all of S at each of its log2(N) levels, a pipelined chain once. NCCL picks its ring or its
(double binary) tree per call from its own tuning tables, not from these formulas.

calibrate() times all_reduce at a few sizes on the current group: alpha from
the smallest (pure latency), beta from the largest (bandwidth, less latency).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minidist.comm.collectives import global_rank

ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True)
class CostModel:
    alpha: float
    """Latency per message, seconds."""
    beta: float
    """Inverse bandwidth, seconds per byte."""

    def predict(self, op: str, payload_bytes: int, world: int, algorithm: str = "ring") -> float:
        """Predicted seconds for one `op` of `payload_bytes` among `world` ranks."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        n, s, a, b = world, float(payload_bytes), self.alpha, self.beta
        if n <= 1:
            return 0.0
        frac = (n - 1) / n
        lg = math.ceil(math.log2(n))
        ring = algorithm == "ring"
        if op == "all_reduce":
            return (2 * (n - 1) if ring else 2 * lg) * a + 2 * s * frac * b
        if op in ("all_gather", "reduce_scatter", "gather", "scatter"):
            return ((n - 1) if ring else lg) * a + s * frac * b
        if op in ("broadcast", "reduce"):
            return (n - 1) * a + s * b if ring else lg * (a + s * b)
        if op == "all_to_all":
            return (n - 1) * a + s * frac * b if ring else lg * a + s / 2 * lg * b
        if op == "barrier":
            return (2 * (n - 1) if ring else lg) * a
        if op in ("send", "recv"):
            return a + s * b if op == "send" else 0.0
        raise ValueError(f"unknown collective {op!r}")


def _time_all_reduce(numel: int, group, iters: int) -> float:
    """Median seconds of one all_reduce of `numel` float32 elements."""
    x = torch.ones(numel, dtype=torch.float32, device=_device(group))
    dist.all_reduce(x, group=group)  # warm-up: connects and allocates
    samples = []
    for _ in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        if x.is_cuda:
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def calibrate(group=None, sizes=(1, 1 << 10, 1 << 16, 1 << 20, 1 << 22), iters: int = 10) -> CostModel:
    """Measure alpha and beta on `group` by timing all_reduce at several sizes.

    Each size gives one sample of t = 2(N-1) alpha + 2 S (N-1)/N beta: the smallest
    fixes alpha, the largest fix beta. A collective: every rank of `group` must call it,
    and all get the same model (rank 0's fit is broadcast); called on one rank alone it waits
    for the others until the process group's timeout (300 s by default). A world of one has
    no communication: 0, 0.
    """
    n = dist.get_world_size(group)
    if n == 1:
        return CostModel(0.0, 0.0)
    xs, ts = [], []
    for numel in sizes:
        xs.append(2 * numel * 4 * (n - 1) / n)
        ts.append(_time_all_reduce(numel, group, iters))
    k = 2 * (n - 1)
    # The smallest payload is all latency; the largest ones are mostly bandwidth. A plain
    # least-squares line through all sizes lets the noise of the big ones swamp alpha.
    alpha = ts[0] / k
    big = [(x, t) for x, t in zip(xs, ts) if x >= xs[-1] / 16]
    beta = max(statistics.median((t - k * alpha) / x for x, t in big), 0.0)
    fit = torch.tensor([alpha, beta], dtype=torch.float64, device=_device(group))
    dist.broadcast(fit, global_rank(group, 0), group=group)
    return CostModel(float(fit[0]), float(fit[1]))
