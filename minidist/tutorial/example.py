"""Train with any piece of the track and check it against one process on the whole batch.

    torchrun --standalone --nproc_per_node=2 -m minidist.tutorial.example naive|flat|overlap|bucketed|zero|fsdp

Every rank trains on its slice of each batch; a plain copy of the model trains on the
whole batch in every process; after a few steps the two must hold the same parameters
(up to floating-point rounding). The same check, at world 2 and 4, is in tests/tutorial/.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import runtime
from minidist.tutorial.ddp_bucketed import BucketedDDP
from minidist.tutorial.ddp_flat import FlatDDP
from minidist.tutorial.ddp_naive import NaiveDDP
from minidist.tutorial.ddp_overlap import OverlapDDP
from minidist.tutorial.fsdp import FSDP
from minidist.tutorial.model import make_model
from minidist.tutorial.sharded_optimizer import ShardedOptimizer

WRAPPERS = {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP,
            "bucketed": lambda m: BucketedDDP(m, bucket_size_mb=0.01), "zero": FlatDDP, "fsdp": FSDP}


def train(piece: str, steps: int = 5) -> float:
    """Train `piece` and a single-process copy side by side; return the largest parameter difference."""
    rank, world = dist.get_rank(), dist.get_world_size()
    reference = make_model(width=32, depth=3, seed=0)
    model = WRAPPERS[piece](make_model(width=32, depth=3, seed=rank))  # rank 0's values win
    make_opt = (lambda ps: ShardedOptimizer(ps, torch.optim.AdamW, lr=1e-2)) if piece == "zero" else \
        (lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    opt_ref, opt = torch.optim.AdamW(reference.parameters(), lr=1e-2), make_opt(model.parameters())
    gen = torch.Generator().manual_seed(1)
    # --8<-- [start:loop]
    for _ in range(steps):
        x = torch.randn(8 * world, 32, generator=gen)  # the whole batch
        y = torch.randn(8 * world, 32, generator=gen)
        mine = slice(rank * 8, (rank + 1) * 8)     # this rank's slice
        loss = nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        model.finish_gradient_synchronization()    # p.grad: mean over ranks
        opt.step()
        opt.zero_grad()
        # the reference: one process, the whole batch
        nn.functional.mse_loss(reference(x), y).backward()
        opt_ref.step()
        opt_ref.zero_grad()
    # --8<-- [end:loop]
    mine = model.gather_full_params() if piece == "fsdp" else dict(model.module.named_parameters())
    return max((mine[name] - p).abs().max().item() for name, p in reference.named_parameters())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("piece", choices=list(WRAPPERS))
    args = ap.parse_args(argv)
    try:
        with runtime.distributed("gloo"):
            torch.set_num_threads(1)
            err = train(args.piece)
            if dist.get_rank() == 0:
                print(f"{args.piece}: largest difference from one process after 5 steps: {err:.1e}")
    except Exception as exc:  # noqa: BLE001 - one line per rank (MINIDIST_TRACEBACK=1 for the trace)
        runtime.exit_on_error(exc)
    runtime.exit_process(0 if err < 1e-5 else 1)


if __name__ == "__main__":
    main()
