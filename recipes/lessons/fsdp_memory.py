"""FSDP cuts what scales with the parameters, not the activations: ZeRO-3's 16 psi / N, and the peak in two regimes.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.fsdp_memory

Per rank, a training step holds the persistent state (fp32 AdamW: parameters 4 psi,
gradients 4 psi, moments 8 psi bytes for psi parameters) plus the activations
saved for backward, which grow with batch x sequence x width x layers. full_shard
keeps ZeRO-3's 16 psi / N between steps (each parameter's rows padded to a multiple of
N: 16 psi_pad / N), plus the units being used during a step; it does nothing to the
activations, which are per rank already. So the same engine saves a lot on a wide model fed
a few tokens, and little on a narrow model fed many.

no_shard (every rank keeps everything: DDP's 16 psi) is the baseline. Measured with torch's
MemTracker, which sees every tensor storage an operator creates, resizes or frees (on any
thread, through weak references); it is opened before the model is built, so what the engine
keeps between steps is everything it created that is still alive after two steps (gradients
kept, set_to_none=False). torch's profiler (profile_memory) would miss the frees gloo's threads
make. On a GPU, also remember that nvidia-smi shows memory *reserved* by the caching allocator,
which stays high after tensors are freed; torch.cuda.max_memory_allocated is the number to compare.
"""

from __future__ import annotations

import contextlib
import gc
import warnings

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from minidist import FSDP
from minidist.mesh import hybrid_mesh
from minidist.models.gpt import GPT, Block, GPTConfig
from recipes.lessons.common import Context, main_for, max_over_ranks, peak_bytes

TITLE = "FSDP memory: ZeRO-3's 16 psi / N, and the peak when parameters or activations dominate"

CLAIM = ("where parameters dominate, full_shard keeps {kept:.3f}x ZeRO-3's 16 psi_pad/N per rank between steps "
         "(torch's MemTracker; want within {tol:.0%}) and peaks at {p:.2f}x no_shard's memory; where activations "
         "dominate its peak is {a:.2f}x no_shard's")
TOLERANCE = 0.02
"""What else may be alive between steps: AdamW's step counters, a collective's buffer gloo still holds (on the
small model where activations dominate these are a few percent of 16 psi / N, which is why it is not held there)."""


def measure(cfg: GPTConfig, batch: int, strategy: str, ctx: Context, count_kept: bool) -> tuple[int | None, int]:
    """(bytes the engine keeps between steps, if count_kept; the peak of a step), the largest over the ranks.

    What is kept is counted by a MemTracker opened before the model exists (every tensor it makes is
    counted); that costs a tracked construction and two tracked steps, so only where the claim needs it."""
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=g)
    mt, kept = MemTracker(), None
    with warnings.catch_warnings(), (mt if count_kept else contextlib.nullcontext()):
        warnings.simplefilter("ignore", UserWarning)  # MemTracker warns about the None grads it meets
        torch.manual_seed(0)  # FSDP2's arguments: no_shard is a ("replicate", "shard") mesh with shards of one rank
        kw = dict(mesh=hybrid_mesh(ctx.topo, shard=1)) if strategy == "no_shard" else {}
        model = FSDP(GPT(cfg), wrap={Block}, reshard_after_forward=strategy == "full_shard", **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            model(x, torch.roll(x, -1, dims=1))[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        for _ in range(2 if count_kept else 1):  # AdamW allocates its moments in the first step
            step()
            mt.reset_mod_stats()    # MemTracker's per-module statistics cover one iteration
        if count_kept:
            dist.barrier()          # gloo's worker drops a finished collective's tensors just after
            gc.collect()
            kept = int(max_over_ranks(mt.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]))
    return kept, int(max_over_ranks(peak_bytes(step, model, opt)))


def zero3_bytes(cfg: GPTConfig, n: int) -> int:
    """16 psi_pad / N: every parameter's rows padded to a multiple of N (FSDP2's layout), fp32 AdamW."""
    return sum(16 * -(-p.shape[0] // n) * (p.numel() // p.shape[0]) for p in GPT(cfg).parameters())


def run(ctx: Context) -> None:
    if ctx.small:
        regimes = {"parameters dominate": (GPTConfig(n_layer=2, n_embd=128, block_size=8), 1),
                   "activations dominate": (GPTConfig(n_layer=2, n_embd=32, block_size=128), 8)}
    else:
        regimes = {"parameters dominate": (GPTConfig(n_layer=8, n_embd=256, block_size=16), 1),
                   "activations dominate": (GPTConfig(n_layer=4, n_embd=64, block_size=256), 32)}
    rows, ratio = [], {}
    for name, (cfg, batch) in regimes.items():
        psi = sum(p.numel() for p in GPT(cfg).parameters())
        got = {s: measure(cfg, batch, s, ctx, s == "full_shard" and name == "parameters dominate")
               for s in ("no_shard", "full_shard")}
        ratio[name] = got["full_shard"][1] / got["no_shard"][1]
        kept = got["full_shard"][0]
        rows.append([name, f"{cfg.n_layer}x{cfg.n_embd}, {batch}x{cfg.block_size} tokens", 16 * psi / 2**20,
                     zero3_bytes(cfg, ctx.world) / 2**20, "-" if kept is None else kept / 2**20,
                     got["no_shard"][1] / 2**20, got["full_shard"][1] / 2**20, ratio[name]])
    ctx.say(f"GPT, fp32 AdamW, N = {ctx.world}; MiB per rank (largest rank), torch's MemTracker: what full_shard "
            f"keeps between steps beside ZeRO-3's 16 psi_pad / N, and the peak of live tensors in a step")
    ctx.table(["regime", "layers x width, batch", "16 psi", "16 psi_pad/N", "full_shard kept", "no_shard peak",
               "full_shard peak", "peak ratio"], rows)
    p, a = ratio["parameters dominate"], ratio["activations dominate"]
    fs = rows[0][4] / rows[0][3]
    ctx.claim(CLAIM.format(kept=fs, tol=TOLERANCE, p=p, a=a), abs(fs - 1) <= TOLERANCE and p < a)


if __name__ == "__main__":
    main_for(run, TITLE)
