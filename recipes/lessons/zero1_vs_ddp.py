"""ZeRO-1 without overlap can be slower than DDP: it saves optimizer memory, not time.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.zero1_vs_ddp

minidist.ShardedOptimizer keeps AdamW's moments (8 psi bytes) only for the
parameters this rank owns, so each rank does 1/N of the update arithmetic. But
after its step every owner must send its freshly updated parameters to everyone
(one broadcast per owner): S (N-1)/N more bytes received per rank, on top of
DDP's all_reduce, and here they travel *after* backward, blocking, with nothing
to hide behind. When the update is cheap next to that transfer (a large model,
a small batch, a slow link), the ZeRO-1 step is slower than DDP's. Libraries
that make ZeRO-1 fast overlap this gather with the next forward, or fuse it into
a reduce_scatter + all_gather in place of the all_reduce.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import DDP, ShardedOptimizer
from recipes.lessons.common import Context, main_for, max_over_ranks

TITLE = "ZeRO-1 without overlap can be slower than DDP"


OPTIMIZERS = {
    "SGD": (torch.optim.SGD, dict(lr=1e-3, momentum=0.9)),    # 4 psi of state, a cheap update
    "AdamW": (torch.optim.AdamW, dict(lr=1e-3)),              # 8 psi of state, a dearer update
}


def build(width: int, layers: int, optimizer: str, zero: bool):
    torch.manual_seed(0)
    net = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(layers)))
    model = DDP(net)
    cls, kw = OPTIMIZERS[optimizer]
    opt = ShardedOptimizer(model.parameters(), cls, **kw) if zero else cls(model.parameters(), **kw)
    return model, opt


def state_bytes(opt) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v) and v.dim() > 0)


def step(model, opt, x) -> tuple[float, float]:
    """One step; returns (forward + backward seconds, optimizer step seconds)."""
    t0 = time.perf_counter()
    model(x).square().mean().backward()
    t1 = time.perf_counter()
    opt.step()
    t2 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1


def run(ctx: Context) -> None:
    width, layers = (512, 4) if ctx.small else (1024, 6)
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(ctx.rank))
    optimizers = ["SGD"] if ctx.small else ["SGD", "AdamW"]
    engines = {(o, zero): build(width, layers, o, zero) for o in optimizers for zero in (False, True)}
    for m in engines.values():
        step(*m, x)                                      # optimizer state is allocated in the first step
    best = {k: [float("inf"), float("inf")] for k in engines}
    for rep in range(4 if ctx.small else 10):            # interleaved; best case of each phase
        for k in (list(engines) if rep % 2 == 0 else list(engines)[::-1]):
            dist.barrier()
            best[k] = [min(a, b) for a, b in zip(best[k], step(*engines[k], x))]
    rows = {}
    for (o, zero), (model, opt) in engines.items():
        fb, upd = (max_over_ranks(v) * 1e3 for v in best[o, zero])
        rows[("ZeRO-1 " if zero else "DDP ") + o] = [state_bytes(opt) / 2**20, fb, upd, fb + upd]
    S = sum(p.numel() * 4 for p in engines[optimizers[0], False][0].parameters())
    ctx.say(f"{layers} x Linear({width}, {width}), S = {S / 2**20:.1f} MiB, batch 4 per rank, N = {ctx.world}; "
            f"best ms of interleaved steps; ZeRO-1's opt.step() = the update of its share + the broadcasts")
    ctx.table(["engine", "optimizer state MiB/rank", "forward+backward ms", "opt.step() ms", "step ms"],
              [[k] + v for k, v in rows.items()])
    ddp, zero = rows["DDP SGD"], rows["ZeRO-1 SGD"]
    ctx.claim(f"with SGD, ZeRO-1 holds 1/{ctx.world} of the momentum ({zero[0]:.1f} vs {ddp[0]:.1f} MiB) but its "
              f"step takes {zero[3] / ddp[3]:.2f}x DDP's: its opt.step() ({zero[2]:.1f} ms) costs more than DDP's "
              f"whole update ({ddp[2]:.1f} ms), because the broadcast of the updated parameters is not hidden",
              abs(zero[0] * ctx.world - ddp[0]) < 0.01 * ddp[0], timing_holds=zero[3] > ddp[3] and zero[2] > 1.2 * ddp[2])

if __name__ == "__main__":
    main_for(run, TITLE)
