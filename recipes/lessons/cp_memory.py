"""Context parallelism divides the activations by cp: each rank keeps its own tokens' only.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.cp_memory     (and --nproc_per_node=4)

Long sequences run out of activation memory first: every layer keeps, per token, its inputs
and the attention's q, k, v and output until backward. Every one of those belongs to a token,
so a rank that holds s/cp of the tokens keeps 1/cp of them; the keys and values of the others
only visit (ring attention: two blocks in flight at a time, minidist.cp.ring) and are not
kept. Measured by torch's MemTracker (every tensor created and freed, on the CPU), per rank:

    kept     the bytes alive after forward minus before: what backward will read; and of them,
             what the attention layers (each block's attn: q, k, v, the output, its log-sum-exp)
             left alive, from MemTracker's snapshots before and after each one's forward
    peak     the most bytes alive above the model's own during forward + backward, against the
             same code on one rank (cp = 1): it also holds the score blocks of attention, which
             minidist computes one chunk pair at a time, (s / chunks)^2 per head, so they fall
             faster than 1/cp

The reference for `kept` is the plain GPT on the whole sequence on one process (torch's
scaled_dot_product_attention, which keeps q, k, v, its output and log-sum-exp, as the ring does).
"""

from __future__ import annotations

import copy
import gc
import warnings

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh

from minidist import cp
from minidist.mesh import CP, DP
from minidist.models.gpt import GPT, GPTConfig
from recipes.lessons.common import Context, MiB, main_for, max_over_ranks

TITLE = "Context parallelism keeps 1/cp of the activations per rank"

CLAIM = ("each of the {n} cp ranks keeps {ratio:.3f}x one process's activations from forward to backward "
         "({kept:.2f} of {whole:.2f} MiB), {attn_ratio:.3f}x of its attention layers' ({attn:.2f} of {attn_whole:.2f} "
         "MiB; 1/cp = {want:.3f}), and peaks {peak:.3f}x as high as the same code at cp = 1 (torch's MemTracker)")


def config(small: bool) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=256 if small else 2048, n_layer=1 if small else 2, n_head=4,
                     n_embd=32 if small else 64)


def measure(model, idx, y) -> tuple[int, int, int]:
    """(bytes kept from forward to backward, of them by the attention layers, peak bytes above the start) of one
    step, by MemTracker (snapshots of all live memory: no garbage collection inside the step)."""
    for p in model.parameters():
        p.grad = None
    mt, cpu = MemTracker(), torch.device("cpu")
    gc.collect()
    gc.disable()
    try:
        with warnings.catch_warnings():  # MemTracker warns about the None grads it is handed; harmless
            warnings.simplefilter("ignore", UserWarning)
            mt.track_external(model)
            with mt:
                start = mt.get_tracker_snapshot()[cpu]["Total"]
                loss = model(idx, y)[1]
                kept = mt.get_tracker_snapshot()[cpu]["Total"] - start
                loss.backward()
                peak = mt.get_tracker_snapshot("peak")[cpu]["Total"] - start
    finally:
        gc.enable()
    snaps = [mt.memory_tracking[block.attn].snapshots for block in model.blocks]
    attn = sum(s["Post-Forward"][-1][cpu]["Total"] - s["Pre-Forward"][-1][cpu]["Total"] for s in snaps)
    return kept, attn, peak


def run(ctx: Context) -> None:
    cfg, n = config(ctx.small), ctx.world
    torch.manual_seed(0)
    plain = GPT(cfg)
    g = torch.Generator().manual_seed(0)
    idx, y = (torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=g) for _ in range(2))
    one = init_device_mesh("cpu", (n, 1), mesh_dim_names=(DP, CP))[CP]  # a cp group of this rank alone
    ring = init_device_mesh("cpu", (n,), mesh_dim_names=(CP,))
    rows, got = [], {}
    for name, model, mesh in (("one process, SDPA", plain, None),
                              ("cp = 1 (the ring's code)", cp.parallelize_gpt(copy.deepcopy(plain), one), one),
                              (f"cp = {n}", cp.parallelize_gpt(copy.deepcopy(plain), ring), ring)):
        inputs = (idx, y) if mesh is None else cp.shard_batch(idx, y, mesh)
        measure(model, *inputs)  # warm up
        kept, attn, peak = (max_over_ranks(v) for v in measure(model, *inputs))
        got[name] = kept, attn, peak
        rows.append([name, inputs[0].shape[1], kept / MiB, attn / MiB, peak / MiB])
    ctx.say(f"GPT L = {cfg.n_layer}, h = {cfg.n_embd}, 2 sequences of s = {cfg.block_size} tokens; MiB per rank "
            f"(the largest over ranks), torch's MemTracker")
    ctx.table(["run", "tokens per rank", "kept fwd->bwd", "of it attention", "peak above start"], rows)
    (whole, attn_whole, _), (kept, attn, peak) = got["one process, SDPA"], got[f"cp = {n}"]
    ratio, attn_ratio, peak_ratio = kept / whole, attn / attn_whole, peak / got["cp = 1 (the ring's code)"][2]
    ctx.claim(CLAIM.format(n=n, ratio=ratio, kept=kept / MiB, whole=whole / MiB, attn_ratio=attn_ratio,
                           attn=attn / MiB, attn_whole=attn_whole / MiB, want=1 / n, peak=peak_ratio),
              abs(ratio * n - 1) < 0.1 and abs(attn_ratio * n - 1) < 0.1 and peak_ratio < 1.5 / n)
    dist.barrier()


if __name__ == "__main__":
    main_for(run, TITLE)
