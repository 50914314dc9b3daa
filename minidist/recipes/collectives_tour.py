"""A tour of the collectives: every call of minidist.comm on small tensors, then what they cost.

    torchrun --standalone --nproc_per_node=2 recipes/collectives_tour.py
    torchrun --standalone --nproc_per_node=3 -m minidist.recipes.collectives_tour
    minidist-tour                               # installed: 2 processes (NPROC=N), through torchrun
    python recipes/collectives_tour.py          # from a checkout: a world of one

Each rank writes its lines into a list; rank 0 prints them grouped by rank at
the end of each act, so the output reads in order instead of interleaved. The
last act times every collective under minidist.comm.trace() and prints the
measured times beside the alpha-beta predictions (alpha and beta fitted with their
errors on this machine first, at sizes other than the one traced).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.distributed as dist

from minidist import comm, runtime
from minidist.comm import ReduceOp


class Transcript:
    """This rank's lines; rank 0 prints every rank's, grouped by rank."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world, self.lines = rank, world, []

    def show(self, label: str, value) -> None:
        self.lines.append(f"rank {self.rank} | {label:34} {value}")

    def flush(self, title: str) -> None:
        everyone = [None] * self.world if self.rank == 0 else None
        dist.gather_object(self.lines, everyone, dst=0)
        if self.rank == 0:
            print(f"\n== {title}")
            for lines in everyone:
                print("\n".join(lines))
        self.lines = []


def act_one(out: Transcript) -> None:
    """The four calls everybody uses: broadcast, all_reduce, reduce, all_gather."""
    rank, world = out.rank, out.world
    t = torch.tensor([rank * 100])
    out.show("before broadcast", t.tolist())
    comm.broadcast(t, src=0)
    out.show("after broadcast(src=0)", t.tolist())
    t = torch.tensor([float(rank + 1)])
    comm.all_reduce(t, ReduceOp.SUM)
    out.show("all_reduce SUM", t.tolist())
    t = torch.tensor([float(rank + 1)])
    comm.reduce(t, dst=0, op=ReduceOp.SUM)
    note = "" if rank == 0 else "  <- not meaningful"  # whatever the backend left here
    out.show("reduce SUM to dst=0", f"{t.tolist()}{note}")
    mine = torch.tensor([rank * 10 + 1])
    pieces = [torch.zeros_like(mine) for _ in range(world)]
    comm.all_gather(pieces, mine)
    out.show("all_gather", [p.item() for p in pieces])
    for op in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT, ReduceOp.AVG):
        t = torch.tensor([float(rank + 1)])
        comm.all_reduce(t, op)
        out.show(f"all_reduce {str(op).split('.')[-1]}", t.tolist())


def act_two(out: Transcript) -> None:
    """Handing pieces out and collecting them: scatter, gather, barrier."""
    rank, world = out.rank, out.world
    buf = torch.zeros(1)
    comm.scatter(buf, [torch.tensor([i * 11.0]) for i in range(world)] if rank == 0 else None, src=0)
    out.show("scatter from 0", buf.tolist())
    bucket = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
    comm.gather(torch.tensor([rank + 0.5]), bucket, dst=0)
    out.show("gather to 0", [b.item() for b in bucket] if rank == 0 else "not the destination")
    comm.barrier()
    out.show("past the barrier", "")


def act_three(out: Transcript) -> None:
    """The two FSDP is made of, and the one mixture-of-experts is made of."""
    rank, world = out.rank, out.world
    # Every rank holds [1, 2, ..., 2N] scaled by (rank + 1); the sum is split in N pieces of 2.
    full = torch.arange(1, 2 * world + 1, dtype=torch.float32) * (rank + 1)
    piece = torch.zeros(2)
    comm.reduce_scatter(piece, full, ReduceOp.SUM)
    out.show("reduce_scatter SUM (my piece)", piece.tolist())
    gathered = torch.zeros(2 * world)
    comm.all_gather(gathered, piece)
    out.show("all_gather of the pieces", gathered.tolist())
    out.show("  = all_reduce SUM of the input", (full / (rank + 1) * sum(range(1, world + 1))).tolist())
    send = torch.tensor([float(rank * 10 + j) for j in range(world)])
    recv = torch.zeros(world)
    comm.all_to_all(recv, send)
    out.show("all_to_all send", send.tolist())
    out.show("all_to_all recv", recv.tolist())


def act_four(out: Transcript, numel: int) -> None:
    """Every collective on a real payload, traced, against the cost model fitted at other sizes.

    alpha and beta come from all_reduces of comm.cost.CALIBRATION_SIZES less those within 4x of `numel`: the traced
    all_reduce's prediction is then out of sample (a model checked at the size it was fitted to
    proves little); each prediction carries the fit's standard error.
    """
    rank, world = out.rank, out.world
    sizes = tuple(s for s in comm.cost.CALIBRATION_SIZES if not numel / 4 < s < 4 * numel)
    model = comm.calibrate(sizes=sizes)
    x = torch.ones(numel)
    with comm.trace() as t:
        for _ in range(3):
            comm.all_reduce(x)
            comm.all_gather(torch.empty(numel), x.view(-1)[: numel // world])
            comm.reduce_scatter(torch.empty(numel // world), x)
            comm.broadcast(x, src=0)
            comm.all_to_all(torch.empty(numel), x)
        comm.barrier()
    if rank == 0:
        link = (model.describe() if world > 1 and model.beta > 0 else
                "no link at N = 1 (nothing is sent: the times are local copies; run under torchrun "
                "--nproc_per_node=2 for alpha and beta)")
        print(f"\n== cost: {link}; N = {world}, S = {numel * 4 / 1e6:.1f} MB per call")
        if model.samples and world > 1:
            print(_out_of_sample(model, t, world))
        print(t.summary(model))


def _out_of_sample(model: comm.CostModel, t: comm.Trace, world: int) -> str:
    """What the fit saw (median [IQR] per size), and the traced all_reduce's prediction beside its measurement."""
    fitted = ", ".join(_size(s.payload_bytes) for s in model.samples)
    spreads = ", ".join(f"{s.median_s * 1e3:.3f} [{s.q1_s * 1e3:.3f}-{s.q3_s * 1e3:.3f}]" for s in model.samples)
    ar = [(r, w) for r, w in zip(t.records, t.wire_times()) if r.op == "all_reduce" and w is not None]
    payload = ar[0][0].payload_bytes
    wire = sorted(w for _, w in ar)
    return (f"fitted on all_reduce of {fitted} (median [IQR] ms: {spreads}); every prediction below is at a size "
            f"the fit did not see\nall_reduce of {_size(payload)}: predicted "
            f"{model.predict('all_reduce', payload, world) * 1e3:.3f} +- {model.spread('all_reduce', payload, world) * 1e3:.3f}"
            f" ms (ring), measured median {statistics.median(wire) * 1e3:.3f} ms of {len(wire)}")


def _size(nbytes: int) -> str:
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << k:
            return f"{nbytes / (1 << k):.4g} {unit}"
    return f"{nbytes} B"


def console(argv: list[str] | None = None) -> None:
    """The console script `minidist-tour`: the README's world (minidist.recipes.launch: 2 processes, or every
    GPU, under minidist.recipes.torchrun); one process for --help."""
    from minidist.recipes import launch

    launch.console("minidist-tour", "minidist.recipes.collectives_tour", sys.argv[1:] if argv is None else list(argv),
                   main, lambda argv: any(a in ("-h", "--help") for a in argv))


def main(argv: list[str] | None = None) -> None:
    """The tour in this process's world. It ends through runtime.run_main: one line per rank on an
    error, and never the interpreter's teardown after gloo ran (it can abort: runtime.exit_process)."""
    runtime.run_main(lambda: tour(argv))


def tour(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=runtime.BACKENDS)
    parser.add_argument("--numel", type=int, default=1 << 20, help="elements per traced call (act four)")
    args = parser.parse_args(argv)
    with runtime.distributed(args.backend, timeout_s=60) as topo:
        torch.set_default_device(topo.device)  # cuda:LOCAL_RANK under nccl
        out = Transcript(topo.rank, topo.world_size)
        act_one(out)
        out.flush("broadcast, all_reduce, reduce, all_gather")
        act_two(out)
        out.flush("scatter, gather, barrier")
        act_three(out)
        out.flush("reduce_scatter, all_gather, all_to_all")
        numel = args.numel - args.numel % (topo.world_size * 4) or topo.world_size
        act_four(out, numel)


if __name__ == "__main__":
    main()
