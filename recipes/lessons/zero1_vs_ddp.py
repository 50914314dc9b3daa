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

import torch
import torch.nn as nn

from minidist import DDP, ShardedOptimizer
from recipes.lessons.common import Context, interleaved_times, main_for, median_time

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


def run(ctx: Context) -> None:
    width, layers = (512, 4) if ctx.small else (1024, 6)
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(ctx.rank))
    optimizers = ["SGD"] if ctx.small else ["SGD", "AdamW"]
    engines = {(o, zero): build(width, layers, o, zero) for o in optimizers for zero in (False, True)}

    def step(model, opt, zero_grad=True):
        model(x).square().mean().backward()
        opt.step()
        if zero_grad:
            opt.zero_grad(set_to_none=True)
    repeats = 3 if ctx.small else 10
    times = interleaved_times({k: (lambda m=m: step(*m)) for k, m in engines.items()}, repeats=repeats)
    rows = []
    for (o, zero), (model, opt) in engines.items():
        step(model, opt, zero_grad=False)                        # leave gradients for opt.step() alone
        opt_ms = median_time(opt.step, repeats=repeats) * 1e3
        opt.zero_grad(set_to_none=True)
        rows.append([("ZeRO-1 " if zero else "DDP ") + o, state_bytes(opt) / 2**20, times[o, zero] * 1e3, opt_ms])
    S = sum(p.numel() * 4 for p in engines[optimizers[0], False][0].parameters())
    ctx.say(f"{layers} x Linear({width}, {width}), S = {S / 2**20:.1f} MiB, batch 4 per rank, N = {ctx.world}; "
            f"median ms of interleaved steps; opt.step() alone (ZeRO-1: the update of its share + the broadcasts)")
    ctx.table(["engine", "optimizer state MiB/rank", "step ms", "opt.step() ms"], rows)
    upd = {r[0]: r[3] for r in rows}
    state = {r[0]: r[1] for r in rows}
    ctx.claim(f"with SGD, ZeRO-1 holds 1/{ctx.world} of the momentum ({state['ZeRO-1 SGD']:.1f} vs "
              f"{state['DDP SGD']:.1f} MiB) but its opt.step() takes {upd['ZeRO-1 SGD'] / upd['DDP SGD']:.1f}x "
              f"DDP's (> 1.2): the broadcast of the updated parameters costs more than the half update it "
              f"saves, and nothing hides it (whole step {times['SGD', True] * 1e3:.0f} vs "
              f"{times['SGD', False] * 1e3:.0f} ms; forward and backward are the same in both)",
              upd["ZeRO-1 SGD"] > 1.2 * upd["DDP SGD"]
              and abs(state["ZeRO-1 SGD"] * ctx.world - state["DDP SGD"]) < 0.01 * state["DDP SGD"])

if __name__ == "__main__":
    main_for(run, TITLE)
