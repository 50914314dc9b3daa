"""FSDP cuts what scales with the parameters, not the activations: peak memory in two regimes.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.fsdp_memory

Per rank, a training step holds the persistent state (fp32 AdamW: parameters 4 psi,
gradients 4 psi, moments 8 psi bytes for psi parameters) plus the activations
saved for backward, which grow with batch x sequence x width x layers. full_shard
divides the persistent state by N (16 psi / N, plus the units being used); it does
nothing to the activations, which are per rank already. So the same engine saves
a lot on a wide model fed a few tokens, and little on a narrow model fed many.

no_shard (every rank keeps everything: DDP's memory) is the baseline; both peaks
are measured with torch's MemTracker (CPU tensors have no allocator statistics).
On a GPU, also remember that nvidia-smi shows memory *reserved* by the caching
allocator, which stays high after tensors are freed; torch.cuda.max_memory_allocated
is the number to compare.
"""

from __future__ import annotations

import torch

from minidist import FSDP
from minidist.mesh import hybrid_mesh
from minidist.models.gpt import GPT, Block, GPTConfig
from recipes.lessons.common import Context, main_for, max_over_ranks, peak_bytes

TITLE = "FSDP memory when parameters dominate vs when activations dominate"

CLAIM = "full_shard's peak is {p:.2f}x no_shard's when parameters dominate, but {a:.2f}x when activations do"


def measure(cfg: GPTConfig, batch: int, strategy: str, ctx: Context) -> int:
    torch.manual_seed(0)  # FSDP2's arguments: no_shard is a ("replicate", "shard") mesh with shards of one rank
    kw = dict(mesh=hybrid_mesh(ctx.topo, shard=1)) if strategy == "no_shard" else {}
    model = FSDP(GPT(cfg), wrap={Block}, reshard_after_forward=strategy == "full_shard", **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=g)

    def step():
        model(x, torch.roll(x, -1, dims=1))[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    step()                          # AdamW allocates its moments in the first step
    return int(max_over_ranks(peak_bytes(step, model, opt)))


def run(ctx: Context) -> None:
    if ctx.small:
        regimes = {"parameters dominate": (GPTConfig(n_layer=6, n_embd=128, block_size=8), 1),
                   "activations dominate": (GPTConfig(n_layer=2, n_embd=32, block_size=128), 8)}
    else:
        regimes = {"parameters dominate": (GPTConfig(n_layer=8, n_embd=256, block_size=16), 1),
                   "activations dominate": (GPTConfig(n_layer=4, n_embd=64, block_size=256), 32)}
    rows, ratio = [], {}
    for name, (cfg, batch) in regimes.items():
        psi = sum(p.numel() for p in GPT(cfg).parameters())
        peaks = {s: measure(cfg, batch, s, ctx) for s in ("no_shard", "full_shard")}
        ratio[name] = peaks["full_shard"] / peaks["no_shard"]
        rows.append([name, f"{cfg.n_layer}x{cfg.n_embd}, {batch}x{cfg.block_size} tokens", 16 * psi / 2**20,
                     peaks["no_shard"] / 2**20, peaks["full_shard"] / 2**20, ratio[name]])
    ctx.say(f"GPT, fp32 AdamW, N = {ctx.world}; peak MiB of live tensors per rank during one step (MemTracker)")
    ctx.table(["regime", "layers x width, batch", "16 psi MiB", "no_shard peak", "full_shard peak", "ratio"], rows)
    p, a = ratio["parameters dominate"], ratio["activations dominate"]
    ctx.claim(CLAIM.format(p=p, a=a), p < 0.75 and a > 0.85)


if __name__ == "__main__":
    main_for(run, TITLE)
