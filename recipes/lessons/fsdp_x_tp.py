"""FSDP x TP against FSDP alone on the same ranks: fewer parameter bytes, more activation bytes.

    torchrun --standalone --nproc_per_node=4 -m recipes.lessons.fsdp_x_tp     (at N = 2: dp 1 x tp 2)

The same GPT and the same global batch of B sequences on N ranks, laid out two ways
(minidist.mesh.ParallelDims; torchtitan's order: TP inside, FSDP over "dp"):

    full_shard            FSDP over all N ranks, B/N sequences each
    full_shard x TP       TP over pairs of ranks (sequence-parallel, vocabulary split), FSDP over
                          the dp = N/2 pairs, B/dp sequences per pair (both ranks of a pair read them)

Bytes per rank and step, S = the model's bytes (padded rows included), S_root = the root unit's:

    full_shard            (3 S - S_root) (N-1)/N                       all parameters, gathered twice
    full_shard x TP       (3 S' - S'_root) (dp-1)/dp + TP's            S' = S/2: each rank gathers its slice
                          TP's = 8 L (B/dp) s h e (1/2) + ...          the activations, minidist.tp.cost

FSDP's bytes follow the parameters and TP's the activations, so which layout sends less
depends on the batch: parameters per rank are psi/N either way, but under TP each rank
gathers half-size units, so the gathered unit in memory halves too; with sequence
parallelism the activations per rank stay those of B/N sequences (each rank handles 2B/N
sequences, but half of every activation). Bytes are the kernel's count (gloo's sockets),
memory the peak of live tensors in one step (torch's MemTracker), parameters what each
rank's optimizer holds.
"""

from __future__ import annotations

import torch

from minidist import FSDP
from minidist.mesh import DP, TP, ParallelDims
from minidist.models.gpt import GPT, Block, GPTConfig
from minidist.tp import cost, parallelize_gpt
from recipes.lessons.common import MiB, Context, kernel_bytes, main_for, max_over_ranks, peak_bytes

TITLE = "FSDP x TP vs FSDP alone at the same world: parameter bytes halve, activation bytes appear"

CLAIM = ("at N = {n} and {B} sequences per step, full_shard over dp {dp} x tp 2 writes {ratio:.3f}x full_shard's bytes "
         "(kernel-counted; formulas {want:.3f}x: FSDP's (3 S - S_root) shrinks with the slices, TP adds "
         "{tp_part:.0f} KiB of activations), holds {params:.3f}x its parameter bytes per rank and peaks at "
         "{peak:.2f}x its memory (its gathered units are half as big)")


def config(small: bool) -> GPTConfig:
    return GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=128 if small else 256)


def layouts(n: int) -> dict[str, ParallelDims]:
    return {"full_shard": ParallelDims.infer(n, shard=-1), "full_shard x TP": ParallelDims.infer(n, tp=2, shard=-1)}


def build(cfg: GPTConfig, dims: ParallelDims):
    layout = dims.build("cpu")
    torch.manual_seed(0)
    net = GPT(cfg)
    if dims.tp > 1:
        net = parallelize_gpt(net, layout[TP], sequence_parallel=True, vocab_parallel=True)
    model = FSDP(net, mesh=layout[DP], wrap={Block})
    return layout, model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def fsdp_bytes(model: FSDP, element_size: int = 4) -> float:
    """(3 S - S_root) (n-1)/n for this model's units (S: padded, the root unit's parameters stay gathered)."""
    n = model.mesh_info.shard_world
    S = sum(u.shards.padded for u in model.units) * element_size
    return (3 * S - model.units[0].shards.padded * element_size) * (n - 1) / n


def run(ctx: Context) -> None:
    cfg, n = config(ctx.small), ctx.world
    B, s = 2 * n, cfg.block_size
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, cfg.vocab_size, (B, s + 1), generator=g)  # the global batch
    rows, got = [], {}
    for name, dims in layouts(n).items():
        layout, model, opt = build(cfg, dims)
        per = B // layout.dp_size
        mine = data[layout.dp_rank * per:(layout.dp_rank + 1) * per]  # tp ranks of a pair: the same rows
        x, y = mine[:, :-1], mine[:, 1:]

        def step():
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for _ in range(2):
            step()
        sent = kernel_bytes(step)
        peak = max_over_ranks(peak_bytes(step, model, opt))
        params = max_over_ranks(sum(p.numel() * p.element_size() for p in model.parameters()))
        formula = fsdp_bytes(model) + cost.step_bytes(cfg, per, s, dims.tp, sequence_parallel=True,
                                                      vocab_parallel=True)
        got[name] = (sent, formula, params, peak)
        rows.append([name, f"{layout.dp_size} x {dims.tp}", per, sent / 2**10, formula / 2**10, params / MiB,
                     peak / MiB])
    ctx.say(f"GPT L = {cfg.n_layer}, h = {cfg.n_embd}, s = {s}, {B} sequences per step on N = {n} ranks; bytes each "
            f"rank wrote in one step (kernel, mean over ranks) beside the formulas, parameters per rank and the step's "
            f"peak of live tensors (MemTracker), largest rank")
    ctx.table(["layout", "dp x tp", "sequences per rank", "written KiB", "formula KiB", "params MiB", "peak MiB"],
              rows)
    (fs, fs_f, fs_p, fs_peak), (tp, tp_f, tp_p, tp_peak) = got["full_shard"], got["full_shard x TP"]
    tp_part = cost.step_bytes(cfg, B // (n // 2), s, 2, sequence_parallel=True, vocab_parallel=True)
    ratio, want = tp / fs, tp_f / fs_f
    ctx.claim(CLAIM.format(n=n, B=B, dp=n // 2, ratio=ratio, want=want, tp_part=tp_part / 2**10, params=tp_p / fs_p,
                           peak=tp_peak / fs_peak),
              abs(ratio / want - 1) < 0.03 and abs(tp_p / fs_p - 1) < 0.03 and tp_peak < fs_peak)


if __name__ == "__main__":
    main_for(run, TITLE)
