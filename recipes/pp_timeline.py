"""Every pipeline schedule drawn from its own run: per rank, when each of its actions ran (docs/pp.md).

    torchrun --standalone --nproc_per_node=4 -m recipes.pp_timeline                        # print
    torchrun --standalone --nproc_per_node=4 -m recipes.pp_timeline --out docs/generated   # and draw

For each schedule at p = N ranks and m = 2N micro-batches, the same model: two layers per rank
whose forward sleeps 4 ms each and whose backward sleeps twice that, half on the input's path
and half on the weights' (benchmarks/emulated.py SleepyLinear: a rank's forward of one
micro-batch is 8 ms, its backward 16 ms, BI and BW 8 ms each). After a warm-up step, one step
runs and every rank's Pipeline.timeline (the runtime's own record of each compute action and
each wait for a message, perf_counter seconds, one clock for all processes on Linux) comes to
rank 0, which prints the schedule's action lists (Schedule.table: what was asked) and the
measured bubble beside the formula, and draws pp_<schedule>.png: one row per rank, one box per
action at the time it ran (what happened). The picture is the run, not the list.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from benchmarks.emulated import SleepyLinear  # run from the repository root
from minidist import pp, runtime

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1))
FORWARD_S = 0.008
"""One rank's forward of one micro-batch (two layers of 4 ms)."""
COLORS = {"F": "#4c78a8", "B": "#f58518", "BI": "#f58518", "BW": "#54a24b", "wait": "#e0e0e0"}


def sleeping_pipeline(name: str, m: int, v: int, forward_s: float, mesh) -> tuple[pp.Pipeline, Callable[[], None]]:
    """`name` over `mesh` on two sleeping layers per rank (a rank's forward: forward_s), and its step; after
    one warm-up step (which sends the shapes)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*(SleepyLinear(8, forward_s / 2) for _ in range(2 * p)))
    cut = pp.split_sequential(layers, [k * 2 // v for k in range(1, p * v)])
    sched = pp.build(name, p, m, v)
    pipe = pp.Pipeline([pp.Stage(cut.modules[s], s, p * v) for s in sched.stages_of(rank)], sched, mesh, F.mse_loss)
    x, y = torch.randn(2 * m, 8), torch.randn(2 * m, 8)
    pipe.step(x, target=y)
    return pipe, lambda: pipe.step(x, target=y)


def one_step(name: str, v: int, mesh) -> tuple[list, float]:
    """This rank's timeline of one step of `name` (after a warm-up), and the step's wall time."""
    pipe, step = sleeping_pipeline(name, 2 * dist.get_world_size(), v, FORWARD_S, mesh)
    dist.barrier()
    t0 = time.perf_counter()
    step()
    return pipe.timeline, time.perf_counter() - t0


def draw(timelines: list[list], path: Path, title: str) -> Path:
    """One row per rank, top to bottom; a box per compute action (its label inside), grey where it waited."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = min(s for tl in timelines for _, s, _ in tl)
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(timelines) + 1.3))
    for r, tl in enumerate(timelines):
        y = len(timelines) - 1 - r
        for what, start, end in tl:
            kind = "wait" if what == "wait" else what.rstrip("0123456789c")
            ax.broken_barh([((start - t0) * 1e3, (end - start) * 1e3)], (y + 0.1, 0.8), color=COLORS[kind],
                           edgecolor="white" if kind != "wait" else None, linewidth=0.5)
            if kind != "wait" and (end - start) * 1e3 > 3:
                ax.text((start + end - 2 * t0) / 2 * 1e3, y + 0.5, what[len(kind):], ha="center", va="center",
                        fontsize=6, color="white")
    ax.set_yticks([len(timelines) - 1 - r + 0.5 for r in range(len(timelines))],
                  [f"rank {r}" for r in range(len(timelines))])
    ax.set_xlabel("ms since the step began")
    ax.set_title(title, fontsize=10)
    labels = {"F": "F", "B": "B (or BI)", "BW": "BW", "wait": "wait"}
    ax.legend(handles=[Patch(color=COLORS[k], label=v) for k, v in labels.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", type=Path, help="draw pp_<schedule>.png into this directory")
    args = ap.parse_args()
    with runtime.distributed("gloo") as topo:
        torch.set_num_threads(1)
        p = topo.world_size
        mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
        for name, v in SCHEDULES:
            timeline, step = one_step(name, v, mesh)
            gathered = [None] * p
            dist.all_gather_object(gathered, (timeline, step))
            if topo.rank:
                continue
            m, seconds = 2 * p, max(s for _, s in gathered)
            measured, formula = 1 - 3 * m * FORWARD_S / seconds, pp.cost.bubble(name, p, m, v)
            print(f"== {name}: p = {p}, m = {m}" + (f", v = {v}" if v > 1 else ""))
            print(pp.build(name, p, m, v).table())
            print(f"step {seconds * 1e3:.0f} ms; bubble measured {measured:.3f}, formula {formula:.3f}\n", flush=True)
            if args.out is not None:
                path = draw([t for t, _ in gathered], args.out / f"pp_{name}.png",
                            f"{name}, p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "") +
                            f": bubble {measured:.2f} (formula {formula:.2f})")
                print(f"wrote {path}\n", flush=True)


if __name__ == "__main__":
    main()
