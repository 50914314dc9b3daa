"""The alpha-beta cost model of collectives, and a calibration that fits alpha and beta with their errors.

A message of b bytes costs alpha + b * beta: alpha is the per-message latency
(seconds), beta the inverse bandwidth (seconds per byte). For N ranks and a
payload of S bytes (the full logical tensor, as in minidist.comm.trace):

    op              ring                                   halving_doubling (log-depth)
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
The second column is recursive halving and doubling (Rabenseifner's all_reduce: a halving
reduce-scatter, then a doubling all-gather; Thakur, Rabenseifner and Gropp 2005) and its one-to-all
and all-to-all relatives: the ring's bandwidth term with log2(N) latencies, so in this model it is
never slower than the ring at a power-of-two N. What makes real systems send large messages round
rings is outside the model (each step talks to a partner 2^k ranks away, over links a ring never
shares; N must be a power of two). Only for broadcast and reduce does it pay in bandwidth: a
binomial tree forwards all of S at each of its log2(N) levels, a pipelined chain once. NCCL's own
algorithms (its ring, its double binary tree, NVLS) and protocols are minidist.comm.nccl: the word
"tree" means NCCL's double binary tree there, and nothing here.

calibrate() times all_reduce at several sizes, `iters` times each, and fits t = 2(N-1) alpha +
2 S (N-1)/N beta by least squares over every sample, weighted by 1/t^2 (relative residuals, so the
small sizes decide alpha and the large ones beta); the model carries the fit's standard errors, its
root-mean-square relative residual and each size's median and interquartile range, and says which
sizes it saw: a prediction at another size is a prediction, at one of them a fit.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minidist.comm.collectives import global_rank

ALGORITHMS = ("ring", "halving_doubling")
CALIBRATION_SIZES = (1, 1 << 8, 1 << 12, 1 << 16, 1 << 18, 1 << 22)
"""float32 elements per timed all_reduce (4 B to 16 MiB); the tour traces 1 << 20, which is not among them."""


@dataclass(frozen=True)
class Sample:
    """One calibration size: the payload and its measured times' median and quartiles (seconds)."""

    payload_bytes: int
    median_s: float
    q1_s: float
    q3_s: float


@dataclass(frozen=True)
class CostModel:
    alpha: float
    """Latency per message, seconds."""
    beta: float
    """Inverse bandwidth, seconds per byte."""
    alpha_err: float = 0.0
    """Standard error of alpha in the fit (one sigma), seconds; 0 for a model not fitted."""
    beta_err: float = 0.0
    """Standard error of beta, seconds per byte."""
    cov: float = 0.0
    """Covariance of alpha and beta in the fit."""
    residual: float = 0.0
    """Root-mean-square relative residual of the fit over every sample: how far a fitted time strays."""
    samples: tuple[Sample, ...] = ()
    """The sizes the fit saw, with each one's median and interquartile range."""

    def predict(self, op: str, payload_bytes: int, world: int, algorithm: str = "ring") -> float:
        """Predicted seconds for one `op` of `payload_bytes` among `world` ranks."""
        k_a, k_b = self._terms(op, payload_bytes, world, algorithm)
        return k_a * self.alpha + k_b * self.beta

    def spread(self, op: str, payload_bytes: int, world: int, algorithm: str = "ring") -> float:
        """One standard error of predict() from the fit's errors of alpha and beta (covariance included)."""
        k_a, k_b = self._terms(op, payload_bytes, world, algorithm)
        var = (k_a * self.alpha_err) ** 2 + (k_b * self.beta_err) ** 2 + 2 * k_a * k_b * self.cov
        return math.sqrt(max(var, 0.0))

    def fitted_at(self, payload_bytes: int) -> bool:
        """Whether the calibration timed this all_reduce payload (a prediction there is not out of sample)."""
        return any(s.payload_bytes == payload_bytes for s in self.samples)

    def _terms(self, op: str, payload_bytes: int, world: int, algorithm: str) -> tuple[float, float]:
        """(count of alpha, bytes of beta) of the module docstring's formula."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        n, s = world, float(payload_bytes)
        if n <= 1:
            return 0.0, 0.0
        frac = (n - 1) / n
        lg = math.ceil(math.log2(n))
        ring = algorithm == "ring"
        if op == "all_reduce":
            return (2 * (n - 1) if ring else 2 * lg), 2 * s * frac
        if op in ("all_gather", "reduce_scatter", "gather", "scatter"):
            return ((n - 1) if ring else lg), s * frac
        if op in ("broadcast", "reduce"):
            return ((n - 1), s) if ring else (lg, lg * s)
        if op == "all_to_all":
            return ((n - 1), s * frac) if ring else (lg, s / 2 * lg)
        if op == "barrier":
            return (2 * (n - 1) if ring else lg), 0.0
        if op in ("send", "recv"):  # one message, one hop; the recv is its other end
            return (1, s) if op == "send" else (0, 0.0)
        raise ValueError(f"unknown collective {op!r}")

    def describe(self) -> str:
        """alpha and beta with their errors, as printed by the tour and the benchmarks."""
        gbps = f"{1 / self.beta / 1e9:.2f} GB/s" if self.beta else "inf GB/s"
        return (f"alpha = {self.alpha * 1e6:.1f} +- {self.alpha_err * 1e6:.1f} us, beta = {self.beta * 1e9:.3f} +- "
                f"{self.beta_err * 1e9:.3f} ns/byte ({gbps}); fit residual {self.residual:.0%} rms")


def fit(payload_bytes: list[int], seconds: list[float], world: int) -> tuple[float, float, float, float, float, float]:
    """(alpha, beta, se alpha, se beta, cov, rms relative residual): weighted least squares of the
    all_reduce formula through every (payload, time) sample, weights 1/t^2 (module docstring)."""
    k = 2 * (world - 1)
    xs = [2 * p * (world - 1) / world for p in payload_bytes]
    w = [1 / t ** 2 for t in seconds]
    s_kk = sum(wi * k * k for wi in w)
    s_kx = sum(wi * k * x for wi, x in zip(w, xs))
    s_xx = sum(wi * x * x for wi, x in zip(w, xs))
    s_kt = sum(wi * k * t for wi, t in zip(w, seconds))
    s_xt = sum(wi * x * t for wi, x, t in zip(w, xs, seconds))
    det = s_kk * s_xx - s_kx ** 2
    if det <= 0:
        raise ValueError("calibration needs at least two distinct sizes")
    alpha, beta = (s_xx * s_kt - s_kx * s_xt) / det, (s_kk * s_xt - s_kx * s_kt) / det
    rel = [(t - k * alpha - x * beta) / t for x, t in zip(xs, seconds)]
    dof = max(len(seconds) - 2, 1)
    sigma2 = sum(r * r for r in rel) / dof
    var_a, var_b, cov = sigma2 * s_xx / det, sigma2 * s_kk / det, -sigma2 * s_kx / det
    return alpha, beta, math.sqrt(var_a), math.sqrt(var_b), cov, math.sqrt(sum(r * r for r in rel) / len(rel))


def _time_all_reduce(numel: int, group, iters: int) -> list[float]:
    """Seconds of `iters` all_reduces of `numel` float32 elements, each after a barrier."""
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
    return samples


def _device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def calibrate(group=None, sizes: tuple[int, ...] = CALIBRATION_SIZES, iters: int = 10) -> CostModel:
    """Fit alpha and beta on `group` from all_reduces of `sizes` float32 elements, `iters` each (module docstring).

    A collective: every rank of `group` must call it, and all get the same model (rank 0's fit is
    broadcast); called on one rank alone it waits for the others until the process group's timeout
    (300 s by default). A world of one has no communication: 0, 0.
    """
    n = dist.get_world_size(group)
    if n == 1:
        return CostModel(0.0, 0.0)
    if len(set(sizes)) < 2 or iters < 1:
        raise ValueError(f"calibrate needs two sizes or more and iters >= 1, got sizes={sizes}, iters={iters}")
    payloads, times, quartiles = [], [], []
    for numel in sizes:
        ts = _time_all_reduce(numel, group, iters)
        payloads += [4 * numel] * len(ts)
        times += ts
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        quartiles.append([4 * numel, q[1], q[0], q[2]])
    stats = torch.tensor([*fit(payloads, times, n), *(v for q in quartiles for v in q)], dtype=torch.float64,
                         device=_device(group))
    dist.broadcast(stats, global_rank(group, 0), group=group)
    a, b, sa, sb, cov, res, *flat = stats.tolist()
    samples = tuple(Sample(int(flat[i]), *flat[i + 1:i + 4]) for i in range(0, len(flat), 4))
    return CostModel(max(a, 0.0), max(b, 0.0), sa, sb, cov, res, samples)
