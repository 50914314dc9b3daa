"""1F1B holds at most p micro-batches of activations, GPipe all m: the same bubble, not the same memory.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.pp_memory     (and --nproc_per_node=4)

GPipe runs every forward before any backward, so the first stage keeps the activations of all
m micro-batches alive at once. 1F1B starts the backward of micro-batch 0 as soon as it can and
then alternates one forward with one backward: the first stage never holds more than p
(rank r: min(m, p - r)), however many micro-batches the step has. Both finish at the same
time (the same bubble, minidist.pp.cost); only the memory differs, which is why 1F1B is the
default and GPipe the textbook picture.

Measured on the first stage's rank by torch's MemTracker (the storages alive at the peak of a
step, less those alive after it): the activations of m and of 2m micro-batches under each
schedule, in units of what one micro-batch's forward leaves for its backward (measured the same
way). The schedules' own action lists say how many each holds (minidist.pp.check.held).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from minidist import pp
from minidist.pp.check import held
from recipes.lessons.common import Context, main_for, peak_above_end

TITLE = "1F1B holds at most p micro-batches of activations, GPipe all m"

CLAIM = ("on the first stage GPipe held {g1:.1f} and {g2:.1f} micro-batches of activations at m = {m1} and {m2}, "
         "1F1B {f1:.1f} and {f2:.1f}: the action lists' {h1}, {h2} and {p}, {p}, each plus the same {c:.1f} of "
         "working memory within 3/4 of a micro-batch (MemTracker, N = {n})")


def layers(p: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict((str(i), nn.Sequential(nn.Linear(width, width), nn.Tanh()))
                                     for i in range(4 * p)))


def activations(name: str, m: int, rows: int, width: int, mesh) -> tuple[float, int]:
    """Bytes the first stage held at the peak of one step above what the step leaves, and what its list holds."""
    rank, p = mesh.get_local_rank(), mesh.size()
    cut = pp.split_sequential(layers(p, width), [4 * k for k in range(1, p)])
    pipe = pp.Pipeline([pp.Stage(cut.modules[rank], rank, p)], pp.build(name, p, m), mesh, F.mse_loss)
    x, y = torch.randn(m * rows, width), torch.randn(m * rows, width)

    def step():
        pipe.step(x, target=y)
        for q in cut.modules[rank].parameters():
            q.grad = None
    step()
    peak, end = peak_above_end(step, cut.modules[rank], x, y)
    return peak - end, held(pipe.schedule, rank)[0]


def run(ctx: Context) -> None:
    p = ctx.world
    rows, width = (128, 64) if ctx.small else (512, 256)
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
    module = pp.split_sequential(layers(p, width), [4 * k for k in range(1, p)]).modules[ctx.rank]
    first, keep = torch.randn(rows, width), []
    saved = peak_above_end(lambda: keep.append(module(first)), module, first)[1] - \
        sum(t.numel() * t.element_size() for t in [first, *module.parameters()])
    m1, m2 = 2 * p, 4 * p
    got = {(name, m): activations(name, m, rows, width, mesh) for name in ("gpipe", "1f1b") for m in (m1, m2)}
    ctx.table(["schedule", "m", "held (list)", "MiB measured", "micro-batches"],
              [[n, m, h, b / 2**20, b / saved] for (n, m), (b, h) in got.items()])
    (g1, h1), (g2, h2), (f1, _), (f2, _) = ((b / saved, h) for b, h in got.values())
    c = g1 - h1  # the backward's working memory, the same under both
    holds = abs(g2 - g1 - (m2 - m1)) < 0.25 and abs(f2 - f1) < 0.25 and abs(f1 - (p + c)) < 0.75
    verdict = torch.tensor(int(holds))
    torch.distributed.broadcast(verdict, 0)  # measured on the first stage: its rank decides for all
    ctx.claim(CLAIM.format(g1=g1, g2=g2, m1=m1, m2=m2, f1=f1, f2=f2, h1=h1, h2=h2, p=p, c=c, n=p), bool(verdict))


if __name__ == "__main__":
    main_for(run, TITLE)
