"""Ring attention traced and drawn: the figure and the tables of docs/cp.md.

    torchrun --standalone --nproc_per_node=4 -m recipes.cp_ring [--out outputs/cp_ring] [--seq 2048]

One layer of causal ring attention (minidist.cp.ring), forward and backward, on one sequence
cut over the N ranks, contiguous then zigzag. Each rank runs it once untraced (warm-up), then
inside minidist.comm.trace(), which stamps every send and receive, while a probe times each
step's compute (minidist.cp.blocks.forward / backward: the tiles of my queries against the
keys and values I hold) and notes each exchange's tag (keys and values, or their gradients).
The probe wraps module functions for this one run; it changes no behaviour. Real compute: on
2 CPU cores with 4 processes the times stretch, their order does not.

Rank 0 prints, per layout, the tiles each rank computes at each step (and whose keys it
holds), the messages each rank sent (from the trace) and each rank's busy time, then draws
the timeline (cp_ring.png): per rank a row of compute steps and an arrow per message, from
the send to the rank that received it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist

from minidist import comm, runtime
from minidist.cp import Chunking, blocks, chunk_ids, positions, ring
from minidist.cp.ring import GRAD

HEADS, DIM = 4, 32
KIND = {ring.KV: "k, v", GRAD: "dk, dv"}


def traced(chunking: Chunking, seq: int) -> dict:
    """This rank's compute steps and messages in one traced forward + backward (module docstring)."""
    cp, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    local = [t[:, :, positions(seq, cp, rank, chunking)] for t in (torch.randn(1, HEADS, seq, DIM, generator=g)
                                                                     for _ in range(3))]
    steps, tags = [], []

    def probe(phase, fn):
        def timed(pairs, *args):
            start, cpu = time.perf_counter(), time.thread_time()
            fn(pairs, *args)
            steps.append((phase, len(pairs.tiles(seq // cp)), start, time.perf_counter(), time.thread_time() - cpu))
        return timed

    def exchange(send, recv, group, tag):
        tags.append(tag)
        return real_exchange(send, recv, group, tag)

    def once():
        inputs = [t.clone().requires_grad_() for t in local]
        ring.ring_attention(*inputs, dist.group.WORLD, chunking).sum().backward()

    once()
    real = blocks.forward, blocks.backward
    real_exchange = ring._exchange
    blocks.forward, blocks.backward = probe("forward", real[0]), probe("backward", real[1])
    ring._exchange = exchange
    try:
        dist.barrier()
        with comm.trace() as tr:
            once()
    finally:
        blocks.forward, blocks.backward = real
        ring._exchange = real_exchange
    sends = [r for r in tr.records if r.op == "send"]
    recvs = [r for r in tr.records if r.op == "recv"]
    return {"rank": rank, "steps": steps,
            "sends": [(r.group.split(":")[-1], KIND[t], r.payload_bytes, r.issued_s) for r, t in zip(sends, tags)],
            "recvs": [(r.group.split(":")[-1], r.completed_s) for r in recvs]}


def tile_table(tiles: list[list[int]]) -> str:
    """tiles[t][r]: what rank r computed at step t of the forward, as the report prints it."""
    n = len(tiles)
    lines = ["tiles of at most 256 x 256 computed at each step (forward; backward the same), whose keys in ():",
             "step  " + "".join(f"{'rank ' + str(r):>10}" for r in range(n))]
    lines += [f"{t:>4}  " + "".join(f"{f'{tiles[t][r]} ({(r - t) % n})':>10}" for r in range(n)) for t in range(n)]
    return "\n".join(lines)


def planned_tiles(chunking: Chunking, n: int, seq: int) -> list[list[int]]:
    """What minidist.cp.blocks plans for each rank and step: the table the report must print."""
    return [[len(blocks.Pairs.of(n, r, (r - t) % n, chunking).tiles(seq // n)) for r in range(n)] for t in range(n)]


def report(chunking: Chunking, ranks: list[dict], seq: int) -> None:
    """Rank 0: the tables (tiles per step, messages, busy time)."""
    n = len(ranks)
    size = seq // (n if chunking is Chunking.CONTIGUOUS else 2 * n)
    held = ", ".join(f"rank {r}: " + " and ".join(f"{c * size}-{(c + 1) * size - 1}" for c in chunk_ids(n, r, chunking))
                     for r in range(n))
    print(f"== {chunking.value}: {n} ranks, one sequence of {seq} tokens, {HEADS} heads of {DIM}, float32 ({held})")
    print(tile_table([[ranks[r]["steps"][t][1] for r in range(n)] for t in range(n)]))
    for r in ranks:
        counts: dict = {}
        for channel, kind, size_b, _ in r["sends"]:
            key = (channel, kind, size_b)
            counts[key] = counts.get(key, 0) + 1
        print(f"rank {r['rank']} sent " + ", ".join(f"{k} x ({kind}) of {b // 1024} KiB to rank {ch.split('>')[1]}"
                                                   for (ch, kind, b), k in counts.items()))
    busy = [sum(s[4] for s in r["steps"]) * 1e3 for r in ranks]
    print("busy ms per rank (forward + backward compute, its thread's CPU time): " + ", ".join(f"{b:.1f}" for b in busy)
          + f"; slowest / mean {max(busy) / (sum(busy) / n):.2f}")


def draw(runs: dict[Chunking, list[dict]], path: Path) -> Path:
    """Both layouts, one panel each: per rank its compute steps and the messages it sent, arrows to the receiver."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = {"forward": "#4C72B0", "backward": "#DD8452", "k, v": "#555555", "dk, dv": "#C44E52"}
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.2 + 1.3 * sum(len(r) for r in runs.values()) / 2))
    for ax, (chunking, ranks) in zip(axes, runs.items()):
        n = len(ranks)
        t0 = min([s[2] for r in ranks for s in r["steps"]] + [m[3] for r in ranks for m in r["sends"]])
        ms = lambda t: (t - t0) * 1e3  # noqa: E731
        most = max(s[1] for r in ranks for s in r["steps"]) or 1
        for r in ranks:
            y = n - 1 - r["rank"]
            for k, (phase, tiles, a, b, _) in enumerate(r["steps"]):
                ax.broken_barh([(ms(a), ms(b) - ms(a))], (y - 0.3, 0.6), color=colors[phase],
                               alpha=0.25 + 0.75 * tiles / most)
                ax.text((ms(a) + ms(b)) / 2, y, str((r["rank"] - k % n) % n), fontsize=6, ha="center", va="center")
        receives = {(r["rank"], ch): [t for c, t in r["recvs"] if c == ch] for r in ranks for ch, _ in r["recvs"]}
        for r in ranks:
            seen: dict = {}
            for channel, kind, _, issued in r["sends"]:
                k = seen[channel] = seen.get(channel, -1) + 1
                dst = int(channel.split(">")[1])
                done = receives[(dst, channel)][k]
                ax.annotate("", xy=(ms(done), n - 1 - dst), xytext=(ms(issued), n - 1 - r["rank"]),
                            arrowprops=dict(arrowstyle="->", lw=0.6, color=colors[kind], alpha=0.8))
        ax.set_yticks(range(n))
        ax.set_yticklabels([f"rank {n - 1 - y}" for y in range(n)], fontsize=7)
        ax.set_title(f"{chunking.value} chunks: each step's compute (the number: whose keys; darker: more tiles), "
                     f"each message an arrow to its receiver", fontsize=8, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1].set_xlabel("ms since the first message was posted (4 processes on 2 cores: times stretch, "
                        "the order holds)", fontsize=7)
    handles = [Patch(color=c, label=k if k in ("forward", "backward") else f"message: {k}") for k, c in colors.items()]
    axes[-1].legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=7,
                    frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trace_both(rank: int, seq: int, out: Path) -> None:
    """Every rank: both layouts traced; rank 0 prints them and draws the picture into `out`."""
    runs = {}
    for chunking in Chunking:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, traced(chunking, seq))
        runs[chunking] = every
        if rank == 0:
            report(chunking, every, seq)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        print(f"timeline: {draw(runs, out / 'cp_ring.png')}")
    dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", default="outputs/cp_ring", help="directory for cp_ring.png")
    ap.add_argument("--seq", type=int, default=2048, help="tokens of the sequence (a multiple of 2 x ranks)")
    args = ap.parse_args()
    try:
        with runtime.distributed("gloo", timeout_s=120) as topo:
            torch.set_num_threads(1)
            trace_both(topo.rank, args.seq, Path(args.out))
    except Exception as exc:  # noqa: BLE001 - one line per rank; MINIDIST_TRACEBACK=1 for the trace
        runtime.exit_on_error(exc)
    runtime.exit_process(0)


if __name__ == "__main__":
    main()
