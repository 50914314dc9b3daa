"""The formulas against instruments minidist does not own: the activations a schedule holds by torch's
MemTracker (GPipe one more micro-batch for each micro-batch, 1F1B the same at any m), the bytes by the
kernel's counters (2 m b s h e per boundary, per step)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from minidist import pp
from minidist.comm import kernel_io
from minidist.pp.check import held
from recipes.lessons.common import peak_above_end
from tests.pp.helpers import mlp, mse

WIDTH, ROWS = 64, 256
"""A micro-batch: 256 rows of width 64 (64 KiB per activation); parameters small beside the activations."""


def _pipe(name: str, m: int, rank: int, p: int) -> tuple[pp.Pipeline, torch.nn.Module]:
    cut = pp.split_sequential(mlp(4 * p, WIDTH), [4 * k for k in range(1, p)])
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
    return pp.Pipeline([pp.Stage(cut.modules[rank], rank, p)], pp.build(name, p, m), mesh, mse), cut.modules[rank]


def _activations() -> dict:
    rank, p = dist.get_rank(), dist.get_world_size()
    out = {}
    for name in ("gpipe", "1f1b"):
        for m in (4, 8):
            pipe, module = _pipe(name, m, rank, p)
            x, y = torch.randn(m * ROWS, WIDTH), torch.randn(m * ROWS, WIDTH)

            def step():
                pipe.step(x, target=y)
                for q in module.parameters():
                    q.grad = None
            step()
            peak, end = peak_above_end(step, module, x, y)
            out[(name, m)] = (peak - end, held(pipe.schedule, rank)[0])
    module = pp.split_sequential(mlp(4 * p, WIDTH), [4 * k for k in range(1, p)]).modules[rank]
    keep, first = [], torch.randn(ROWS, WIDTH)  # the input exists before, as the batch does
    saved, params = peak_above_end(lambda: keep.append(module(first)), module, first)[1], \
        sum(q.numel() * q.element_size() for q in module.parameters()) + first.numel() * first.element_size()
    out["saved"] = saved - params  # what one micro-batch's forward leaves for its backward
    return out


def test_gpipe_holds_every_micro_batch_1f1b_at_most_p(run_dist):
    r = run_dist(2, _activations)[0]  # the first stage's rank: it holds the most (p under 1F1B)
    s = r["saved"]
    gpipe4, gpipe8, f4, f8 = (r[k][0] for k in (("gpipe", 4), ("gpipe", 8), ("1f1b", 4), ("1f1b", 8)))
    assert [r[k][1] for k in (("gpipe", 4), ("gpipe", 8), ("1f1b", 4), ("1f1b", 8))] == [4, 8, 2, 2]
    assert abs((gpipe8 - gpipe4) / s - 4) < 0.1, "GPipe: each micro-batch more is one more activation held"
    assert abs(f8 - f4) < 0.1 * s, "1F1B: as many micro-batches as you like, the same activations held"
    overhead = gpipe4 - 4 * s  # the backward's own working memory, the same in both
    assert abs(f4 - (2 * s + overhead)) < 0.75 * s, (f4 / s, overhead / s)  # the estimate: held x saved + overhead


def _bytes(name: str, v: int) -> tuple[float, float]:
    rank, p = dist.get_rank(), dist.get_world_size()
    cut = pp.split_sequential(mlp(8, WIDTH), [k * 8 // (p * v) for k in range(1, p * v)])
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
    sched = pp.build(name, p, 4, v)
    pipe = pp.Pipeline([pp.Stage(cut.modules[s], s, p * v) for s in sched.stages_of(rank)], sched, mesh, mse)
    x, y = torch.randn(4 * ROWS, WIDTH), torch.randn(4 * ROWS, WIDTH)
    pipe.step(x, target=y)  # the first step also sends each boundary's shape
    with kernel_io.written() as w:
        pipe.step(x, target=y)
    mean = torch.tensor(float(w.bytes))
    dist.all_reduce(mean)
    return mean.item() / p, pp.cost.step_bytes(sched, ROWS * WIDTH, 4)


def test_bytes_on_the_wire_are_two_activations_per_micro_batch_per_boundary(run_dist):
    for name, v in (("1f1b", 1), ("interleaved_1f1b", 2)):
        kernel, formula = run_dist(2, _bytes, name, v)[0]
        assert 1.0 <= kernel / formula < 1.01, f"{name}: the kernel counted {kernel:.0f} bytes, formula {formula:.0f}"
