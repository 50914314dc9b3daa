"""minidist.pp against torch.distributed.pipelining: the bubble each measures, and their step times.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=4 benchmarks/pp_vs_torch.py
    ... benchmarks/pp_vs_torch.py --microbatches 1 2 4 8 16 --forward-ms 10 --repeats 5

Every rank holds the same work: two layers per rank (one per stage under interleaving, v = 2)
whose forward sleeps and whose backward sleeps twice as long, half on the input's path and half
on the weights' (benchmarks/emulated.py SleepyLinear: time that passes without using a core,
as an accelerator's kernels would, so 4 ranks on 2 cores compete for nothing but the host work).
A rank's compute per step is therefore known without measuring it: busy = m (t_F + t_B) =
3 m t_F. The step time is measured: the slowest rank's wall time of one step, after a barrier,
the median of the repeats. Then

    bubble   1 - busy / step: the share of the step a rank waited (the formulas: minidist.pp.cost)
    ratio    minidist's step / torch's step, the two run in alternating rounds (the order swapped
             every repeat) in this one invocation, so machine noise hits both alike

Schedules, minidist's beside torch's on the same split: gpipe / ScheduleGPipe, 1f1b /
Schedule1F1B (which refuses m < p), interleaved_1f1b / ScheduleInterleaved1F1B (v = 2, m a
multiple of p), zb_h1 / ScheduleInterleavedZeroBubble with one stage per rank (ZB-H1's order).
The gap between a measured bubble and the formula is each runtime's overhead per operation
(launching sends and receives, Python) divided by the step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from emulated import SleepyLinear  # benchmarks/emulated.py: the script's own directory
from minidist import pp, runtime

WIDTH, ROWS = 16, 2
"""Tiny tensors: the time is the sleeps' and the runtimes' own; bytes do not matter here."""
LAYERS_PER_RANK = 2
TORCH = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
         "zb_h1": "ScheduleInterleavedZeroBubble"}


def model(p: int, layer_s: float) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(SleepyLinear(WIDTH, layer_s) for _ in range(LAYERS_PER_RANK * p)))


def virtual(name: str) -> int:
    return 2 if name == "interleaved_1f1b" else 1


def minidist_step(name: str, p: int, m: int, layer_s: float, mesh):
    v, rank = virtual(name), dist.get_rank()
    cut = pp.split_sequential(model(p, layer_s), [k * LAYERS_PER_RANK // v for k in range(1, p * v)])
    sched = pp.build(name, p, m, v)
    pipe = pp.Pipeline([pp.Stage(cut.modules[s], s, p * v) for s in sched.stages_of(rank)], sched, mesh, F.mse_loss)
    x, y = torch.randn(m * ROWS, WIDTH), torch.randn(m * ROWS, WIDTH)
    return lambda: pipe.step(x, target=y)


def torch_step(name: str, p: int, m: int, layer_s: float):
    """torch's schedule on the same split, or None where it refuses these sizes."""
    from torch.distributed import pipelining
    v, rank = virtual(name), dist.get_rank()
    cut = pp.split_sequential(model(p, layer_s), [k * LAYERS_PER_RANK // v for k in range(1, p * v)])
    stages = [pipelining.PipelineStage(cut.modules[s], s, p * v, torch.device("cpu")) for s in pp.stages_of(rank, p, v)]
    cls = getattr(pipelining, TORCH[name])
    try:
        sched = cls(stages if name in ("interleaved_1f1b", "zb_h1") else stages[0], m, loss_fn=F.mse_loss)
    except ValueError:
        return None
    x, y = torch.randn(m * ROWS, WIDTH), torch.randn(m * ROWS, WIDTH)
    last = rank == (p * v - 1) % p
    return lambda: sched.step(x, target=y) if rank == 0 else sched.step(target=y) if last else sched.step()


def timed(steps: dict, repeats: int) -> dict[str, float]:
    """The median step time of each, the slowest rank's, in alternating order; one warm-up step each."""
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for rep in range(repeats):
        for k in (list(steps) if rep % 2 == 0 else list(steps)[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            steps[k]()
            t = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(t, dist.ReduceOp.MAX)
            times[k].append(t.item())
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--schedules", nargs="+", default=list(TORCH), choices=list(TORCH))
    ap.add_argument("--forward-ms", type=float, default=40.0, help="one rank's forward of one micro-batch")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with runtime.distributed("gloo") as topo:
        torch.set_num_threads(1)
        p, t_f = topo.world_size, args.forward_ms / 1e3
        mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
        if topo.rank == 0:
            print(f"pp = {p} ranks, forward {args.forward_ms:g} ms and backward {2 * args.forward_ms:g} ms per "
                  f"micro-batch per rank (sleeps), median of {args.repeats} alternating repeats")
            print(f"{'schedule':<18}{'m':>4}{'formula':>9}{'minidist':>10}{'torch':>8}{'ms/step':>9}{'ratio':>7}")
        for name in args.schedules:
            for m in args.microbatches:
                if name == "interleaved_1f1b" and m % p:
                    continue
                layer_s = t_f / LAYERS_PER_RANK
                steps = {"minidist": minidist_step(name, p, m, layer_s, mesh)}
                theirs = torch_step(name, p, m, layer_s)
                if theirs is not None:
                    steps["torch"] = theirs
                got = timed(steps, args.repeats)
                busy = 3 * m * t_f
                bub = {k: 1 - busy / v for k, v in got.items()}
                formula = pp.cost.bubble(name, p, m, virtual(name))
                if topo.rank == 0:
                    theirs_txt = f"{bub['torch']:>8.3f}" if "torch" in got else f"{'refuses':>8}"
                    ratio = f"{got['minidist'] / got['torch']:>7.2f}" if "torch" in got else f"{'-':>7}"
                    print(f"{name:<18}{m:>4}{formula:>9.3f}{bub['minidist']:>10.3f}{theirs_txt}"
                          f"{got['minidist'] * 1e3:>9.1f}{ratio}", flush=True)


if __name__ == "__main__":
    main()
