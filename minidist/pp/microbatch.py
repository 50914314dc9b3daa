"""Micro-batches: a step's batch cut into m equal pieces, and the loss scaled so their sum is the batch's.

    pieces = split(batch, m)          # m tensors of batch.shape[0] / m rows each (views, no copy)
    loss_i = loss_fn(out_i, target_i) * scale(m)

Why equal pieces: a mean loss over the batch is the mean of the micro-batches' mean losses
only when they hold the same number of samples, and then each micro-batch's loss, scaled by
1/m, contributes exactly its share of the batch's gradient: the m backward passes accumulate
in p.grad what one backward of the whole batch would leave there (as gradient accumulation
does; torch.distributed.pipelining's scale_grads=True divides the gradients by m instead).
"""

from __future__ import annotations

import torch


def split(batch: torch.Tensor, microbatches: int, what: str = "batch") -> list[torch.Tensor]:
    """`batch` cut along dim 0 into `microbatches` equal pieces; one line naming the sizes if it does not divide."""
    n = batch.shape[0]
    if microbatches < 1 or n % microbatches:
        valid = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
        raise ValueError(f"microbatches={microbatches} must divide the {what}'s {n} samples "
                         f"(equal micro-batches keep the mean loss exact); valid: {valid}")
    return list(batch.chunk(microbatches))


def scale(microbatches: int) -> float:
    """What each micro-batch's (mean) loss is multiplied by so the m backwards sum to the batch's gradient."""
    return 1.0 / microbatches
