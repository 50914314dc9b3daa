"""What a pipeline costs, by formula: the bubble, the bytes on the wire, the activations held.

p ranks, m micro-batches, v stages per rank; t_F, t_B = t_BI + t_BW the time of one
micro-batch's forward and backward through one rank's layers.

Bubble: the share of each rank's step spent waiting. A rank computes m (t_F + t_B); the
last micro-batch's forward reaches the last rank p - 1 forwards late and its backward comes
back p - 1 backwards late, so the step lasts (m + p - 1)(t_F + t_B):

    GPipe, 1F1B        (p-1) / (m + p - 1)                   the same: 1F1B changes memory, not time
    interleaved 1F1B   (p-1) / (v m + p - 1)                 the fill and drain run on chunks 1/v the size
    ZB-H1              (p-1)(t_F + t_BI - t_BW) / (m (t_F + t_B) + (p-1)(t_F + t_BI - t_BW))
                       = (p-1) / (3 m + p - 1) when t_F = t_BI = t_BW, for m >= p: the deferred
                       weight gradients fill most of the drain; for m < p the step is
                       (m + p - 1)(t_F + t_BI) + t_BW (too few BW to fill it); both as long as
                       t_BW <= t_F + t_BI (the weight half no longer than the rest)

Bytes, per stage boundary and step: each micro-batch's activation forward and its gradient
backward, 2 m x (b s h) x e bytes for micro-batches of b sequences of s tokens of width h,
e bytes per element; point to point, one hop, whatever p is. S = p v stages have S - 1
boundaries, so the mean over ranks is 2 m b s h e (S - 1) / p. Interleaving multiplies the
messages by about v for the same compute: its price for the smaller bubble.

Activations held per rank (minidist.pp.check counts them from the action lists): GPipe
all m micro-batches; 1F1B and ZB-H1 at most p (rank r: min(m, p - r)), whatever m is;
interleaved min(v m, (v-1) p + 2 (p-1-r) + 1) chunks of 1/v of the rank's layers each.
"""

from __future__ import annotations

from minidist.pp.schedule import Schedule


def bubble(schedule: str, pp: int, microbatches: int, virtual: int = 1, t_f: float = 1.0,
           t_bi: float = 1.0, t_bw: float = 1.0) -> float:
    """The bubble fraction of `schedule` (module docstring); t_bi + t_bw is the backward."""
    p, m, v = pp, microbatches, virtual
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved_1f1b":
        return (p - 1) / (v * m + p - 1)
    if schedule == "zb_h1":
        busy = m * (t_f + t_bi + t_bw)
        if m < p:  # too few weight gradients to fill the drain: only the first rank's last one is left over
            return 1 - busy / ((m + p - 1) * (t_f + t_bi) + t_bw)
        idle = (p - 1) * (t_f + t_bi - t_bw)
        return idle / (busy + idle)
    raise ValueError(f"no bubble formula for schedule {schedule!r}")


def boundary_bytes(microbatches: int, activation_numel: int, element_size: int) -> int:
    """Bytes crossing one stage boundary in one step: 2 m (b s h) e (activations forward, gradients back)."""
    return 2 * microbatches * activation_numel * element_size


def step_bytes(schedule: Schedule, activation_numel: int, element_size: int) -> float:
    """Bytes one rank sends per step, the mean over the pipeline's ranks: (S - 1) boundaries' worth / p."""
    boundaries = schedule.num_stages - 1
    return boundaries * boundary_bytes(schedule.microbatches, activation_numel, element_size) / schedule.pp
