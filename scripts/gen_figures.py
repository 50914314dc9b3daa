"""Draw the figures the pages need from the code's own numbers, each stamped with the commit that made it.

    .venv/bin/python scripts/gen_figures.py zero tp_block                                # no world needed
    .venv/bin/torchrun --standalone --nproc_per_node=2 scripts/gen_figures.py memory     # measures a step

zero       ZeRO's Figure 1 (Rajbhandari et al. 2020): what each rank keeps of the parameters, gradients
           and optimizer state at each stage, drawn for 4 ranks, with the bytes per rank that
           minidist.compare.estimate.model_state_bytes gives for the paper's 7.5B parameters at N = 64
           (mixed precision: 2 + 2 + 12 bytes per parameter)
tp_block   one transformer block under tensor parallelism and under sequence parallelism: its layers
           top to bottom, the shape of the activations between them, and each collective, forward
           and backward; the number of each collective is checked against minidist.tp.cost's
           inventory before anything is drawn
memory     live tensor bytes over one training step of DDP, ZeRO-1 and FSDP (full_shard) on the same
           GPT at N = 2: torch's profiler's allocation events (profile_memory) during the step, on top
           of what each engine held when it began (torch's MemTracker), with forward, backward and
           the optimizer step marked

Each PNG is written to docs/generated/fig_<name>.png with the commit in its footer; commit the code
first (a tree with uncommitted changes to the code is stamped "-dirty").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated"
sys.path.insert(0, str(ROOT))
COLORS = {"parameters": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868"}


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "minidist", "scripts", "recipes"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return head.strip() + ("-dirty" if dirty else "")


def save(fig, name: str, source: str) -> None:
    fig.text(0.01, 0.005, f"scripts/gen_figures.py {name} at commit {commit()}; {source}", fontsize=7, color="0.4")
    fig.savefig(OUT / f"fig_{name}.png", dpi=100)  # 820 px: the page's width, text at its size
    plt.close(fig)
    print(f"wrote docs/generated/fig_{name}.png")


def zero() -> None:
    """ZeRO's model states per rank at each stage (drawn for 4 ranks), and the bytes at psi = 7.5B, N = 64."""
    from minidist.compare.estimate import model_state_bytes
    stages = [("baseline (DDP)", "ddp"), ("P_os (ZeRO-1)", "zero1"), ("P_os+g (ZeRO-2)", "zero2"),
              ("P_os+g+p (ZeRO-3, full_shard)", "full_shard")]
    ranks, psi, world = 4, 7.5e9, 64
    widths = {"parameters": 2, "gradients": 2, "optimizer": 12}
    fig, ax = plt.subplots(figsize=(8.2, 4.6))
    for row, (label, strategy) in enumerate(stages):
        y = len(stages) - 1 - row
        held = model_state_bytes(psi, strategy, ranks, 2, 2, 12)
        for r in range(ranks):
            x = r * 17.5
            for role, w in widths.items():
                split = held[role] < widths[role] * psi                     # partitioned at this stage
                ax.add_patch(Rectangle((x, y + 0.15), w, 0.6, facecolor="none", edgecolor=COLORS[role], lw=0.8))
                lo = x + (w * r / ranks if split else 0)
                ax.add_patch(Rectangle((lo, y + 0.15), w / ranks if split else w, 0.6, color=COLORS[role]))
                x += w
        gb = model_state_bytes(psi, strategy, world, 2, 2, 12)["total"] / 1e9
        ax.text(-1, y + 0.45, label.replace(" (", "\n("), ha="right", va="center", fontsize=9)
        ax.text(ranks * 17.5 + 1, y + 0.45, f"{gb:.1f} GB\nper rank", va="center", fontsize=9)
    for r in range(ranks):
        ax.text(r * 17.5 + 8, len(stages) + 0.05, f"rank {r}", ha="center", fontsize=8.5)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, ["parameters (2 psi, bf16)", "gradients (2 psi, bf16)", "optimizer state (12 psi:\nfp32 "
                        "master + Adam's moments)"], loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3,
              fontsize=8, frameon=False)
    ax.set_xlim(-22, ranks * 17.5 + 12)
    ax.set_ylim(-0.1, len(stages) + 0.4)
    ax.axis("off")
    ax.set_title("What each rank keeps at each ZeRO stage (filled: held by this rank; 4 ranks drawn),\n"
                 f"and the bytes per rank for psi = 7.5B parameters at N = {world} (ZeRO's Figure 1)", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, "zero", "bytes: minidist.compare.estimate.model_state_bytes(7.5e9, strategy, 64, 2, 2, 12)")


BLOCK = [  # (layer; the collective at its entrance under TP, under SP; its output's shape under TP, under SP)
    ("ln_1 (LayerNorm)", None, None, "(b, s, h)", "(b, s/N, h)"),
    ("attn.qkv (column-parallel, split by heads)", "f", "all_gather", "(b, s, 3h/N)", "(b, s, 3h/N)"),
    ("attention on n_head/N heads", None, None, "(b, s, h/N)", "(b, s, h/N)"),
    ("attn.proj (row-parallel)", None, None, "(b, s, h) partial sums", "(b, s, h) partial sums"),
    ("+ residual", "g", "reduce_scatter", "(b, s, h)", "(b, s/N, h)"),
    ("ln_2 (LayerNorm)", None, None, "(b, s, h)", "(b, s/N, h)"),
    ("mlp.fc (column-parallel, 4h/N)", "f", "all_gather", "(b, s, 4h/N)", "(b, s, 4h/N)"),
    ("GELU", None, None, "(b, s, 4h/N)", "(b, s, 4h/N)"),
    ("mlp.proj (row-parallel)", None, None, "(b, s, h) partial sums", "(b, s, h) partial sums"),
    ("+ residual", "g", "reduce_scatter", "(b, s, h)", "(b, s/N, h)"),
]
EDGE = {"f": ("identity", "all_reduce"), "g": ("all_reduce", "identity"),
        "all_gather": ("all_gather", "reduce_scatter"), "reduce_scatter": ("reduce_scatter", "all_gather")}


def block_counts(sp: bool) -> dict[str, int]:
    """Collectives of one block's forward + backward, as drawn."""
    counts: dict[str, int] = {}
    for _, tp_edge, sp_edge, _, _ in BLOCK:
        edge = sp_edge if sp else tp_edge
        for op in EDGE.get(edge, ()):
            if op != "identity":
                counts[op] = counts.get(op, 0) + 1
    return counts


def tp_block() -> None:
    """One block under TP and SP; the drawn collectives must be minidist.tp.cost's per-block inventory."""
    from minidist.models.gpt import GPTConfig
    from minidist.tp import cost
    cfg = GPTConfig(n_layer=1, n_embd=64, n_head=4, block_size=16)
    act = 2 * 16 * 64
    for sp in (False, True):
        inventory = {op: n for (op, numel), n in cost.collectives(cfg, 2, 16, sequence_parallel=sp).items()
                     if numel == act}
        if sp:
            inventory["all_gather"] -= 2  # the head's input and the embedding's gradient: outside the block
        if inventory != block_counts(sp):
            raise SystemExit(f"the drawn block ({block_counts(sp)}) is not minidist.tp.cost's ({inventory})")
    fig, axes = plt.subplots(1, 2, figsize=(8.2, 8.4))
    for ax, sp in zip(axes, (False, True)):
        n = len(BLOCK)
        for i, (layer, tp_edge, sp_edge, tp_shape, sp_shape) in enumerate(BLOCK):
            y = n - i
            edge = sp_edge if sp else tp_edge
            ax.add_patch(Rectangle((0.02, y - 0.3), 0.96, 0.5, facecolor="#EAEAF2", edgecolor="0.3"))
            ax.text(0.5, y - 0.05, layer.replace(" (", "\n("), ha="center", va="center", fontsize=8)
            if edge is not None:
                fwd, bwd = EDGE[edge]
                label = (f"{edge}: " if edge in ("f", "g") else "") + f"forward {fwd},\nbackward {bwd}"
                ax.annotate("", xy=(0.25, y + 0.2), xytext=(0.25, y + 0.7),
                            arrowprops=dict(arrowstyle="->", color="#C44E52", lw=2))
                ax.text(0.29, y + 0.45, label, fontsize=8, color="#C44E52", va="center")
            ax.text(0.98, y - 0.42, sp_shape if sp else tp_shape, fontsize=7.5, color="0.35", ha="right", va="center")
        ax.set_xlim(0, 1.0)
        ax.set_ylim(0.3, n + 1)
        ax.axis("off")
        counts = block_counts(sp)
        ax.set_title(("sequence parallelism" if sp else "tensor parallelism") + ": per block and step\n"
                     + ", ".join(f"{k} x{v}" for k, v in counts.items()) + "\n" +
                     ("(TP's 8 b s h e (N-1)/N bytes per rank, plus h-sized all_reduces\nof the norms' and row "
                      "biases' gradients)" if sp else "(8 b s h e (N-1)/N bytes per rank)"), fontsize=9.5)
    fig.suptitle("One transformer block over N ranks: the layers top to bottom, each one's output shape\n"
                 "(e bytes per element), and a collective at each red arrow (inside a TP region nothing moves)",
                 fontsize=9.5)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    save(fig, "tp_block", "counts checked against minidist.tp.cost.collectives")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("figures", nargs="+", choices=("zero", "tp_block", "memory"))
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.figures:
        if name == "memory":
            from gen_figure_memory import memory
            memory(save)
        else:
            {"zero": zero, "tp_block": tp_block}[name]()
    if "RANK" in os.environ:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
