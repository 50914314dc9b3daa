"""Sequence parallelism moves tensor parallelism's bytes and divides the activations between its regions.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.sequence_parallel     (and --nproc_per_node=4)

Under TP every rank of the group holds the whole (b, s, h) activations between two TP
regions (after g's all_reduce) and repeats the same work on them: layer norms, dropouts,
residual adds, each keeping its input or mask for backward. An all_reduce is a
reduce_scatter followed by an all_gather; sequence parallelism (Korthikanti et al. 2022,
minidist.tp.sequence) stops after the reduce_scatter, runs the norms and dropouts on this
rank's s/N tokens, and does the all_gather at the entrance of the next region. Per block
and step:

    TP       4 all_reduces of b s h                 8 b s h e (N-1)/N bytes per rank
    TP + SP  4 reduce_scatters + 4 all_gathers       the same 8 b s h e (N-1)/N

plus, under SP, the gradients of what stays replicated but now sees 1/N of the tokens on
each rank (each norm's weight and bias, each row-parallel bias, the position embedding),
summed over the ranks: a few h-sized collectives (minidist.tp.cost has the inventory). And
with the vocabulary whole (the default, vocab_parallel=False) the embedding and the head stay
replicated, so SP must also all_gather the head's input (the last norm's output, split along the
sequence) and, in backward, the embedding's gradient: 2 more b s h e (N-1)/N per step, 1/(4 L)
of TP's activation bytes. With the vocabulary split both runs move the same activations there.
The lesson runs both pairs: the whole vocabulary's extra is large (0.125 of TP's at L = 2), so a
tolerance of 0.01 resolves it; split, SP's parameter-sized extra (0.2%) is below what gloo's
per-call headers let the kernel resolve, and the claim says only that the bytes agree with the
formula within 0.01. The activations the norms and dropouts keep are measured by torch's
MemTracker (live tensor memory before and after each module's forward), not by minidist: 1/N of
TP's under SP.
"""

from __future__ import annotations

import gc
import warnings

import torch
import torch.nn as nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh

from minidist.mesh import TP
from minidist.models.gpt import GPT, GPTConfig
from minidist.tp import cost, parallelize_gpt
from recipes.lessons.common import Context, kernel_bytes, main_for

TITLE = "Sequence parallelism: TP's bytes (and the whole vocabulary's extra), 1/N of the norms' and dropouts' activations"

CLAIM = ("with the vocabulary whole (the default) sequence parallelism writes {ratio:.3f}x TP's bytes per step "
         "(kernel-counted; formula {want:.3f}x: the head's input and the embedding's gradient all_gathered, "
         "2 b s h e (N-1)/N = {act:.0f} KiB, plus {extra:.1f} KiB of the norms', biases' and positions' gradients; "
         "tolerance 0.01 against an effect of {effect:.3f}), with it split {ratio_split:.3f}x (formula "
         "{want_split:.4f}x), and keeps 1/{n} of the norms' and dropouts' activations ({sp:.0f} of {tp:.0f} KiB per "
         "rank, torch's MemTracker)")
PLANS = {"TP": (False, False), "TP + SP": (True, False), "TP, vocab split": (False, True),
         "TP + SP, vocab split": (True, True)}
"""name: (sequence_parallel, vocab_parallel)"""


def config(small: bool) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64, dropout=0.1)


def build(cfg: GPTConfig, sp: bool, vocab: bool):
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),), mesh_dim_names=(TP,))
    return parallelize_gpt(GPT(cfg), mesh, sequence_parallel=sp, vocab_parallel=vocab)


def step(model, x, y) -> None:
    model(x, y)[1].backward()
    for p in model.parameters():
        p.grad = None


def forward_memory(model, x, y) -> dict[str, int]:
    """Bytes each layer norm and dropout module allocated in the forward and left alive for backward
    (its output, a norm's statistics, a dropout's mask): torch's MemTracker, which sees every tensor
    created, snapshots live memory before and after each module's forward."""
    mt = MemTracker()
    mt.track_external(model)
    gc.collect()  # a snapshot is all live memory: no garbage from before may be freed inside a module
    gc.disable()
    try:
        with warnings.catch_warnings():  # MemTracker warns about the None grads it is handed; harmless
            warnings.simplefilter("ignore", UserWarning)
            with mt:
                out = model(x, y)  # kept alive: the graph holds what backward needs
    finally:
        gc.enable()
    del out
    kept = {"layer_norm": 0, "dropout": 0}
    for m in model.modules():
        kind = "layer_norm" if isinstance(m, nn.LayerNorm) else "dropout" if isinstance(m, nn.Dropout) else None
        if kind is not None:
            snaps = mt.memory_tracking[m].snapshots
            before, after = snaps["Pre-Forward"][-1][x.device], snaps["Post-Forward"][-1][x.device]
            kept[kind] += after["Total"] - before["Total"]
    return kept


def run(ctx: Context) -> None:
    cfg, n = config(ctx.small), ctx.world
    b = 8 if ctx.small else 32
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (b, cfg.block_size + 1), generator=g)  # the same on every tp rank
    x, y = x[:, :-1], x[:, 1:]
    rows, got = [], {}
    for name, (sp, vocab) in PLANS.items():
        model = build(cfg, sp, vocab)
        model.train()
        for _ in range(2):
            step(model, x, y)
        sent = kernel_bytes(lambda: step(model, x, y))
        mem = {"layer_norm": 0, "dropout": 0}
        if not vocab:  # the norms and dropouts are the same either way: measured on the first pair
            # gloo's worker thread drops a finished all_reduce's tensor (b s h e bytes) whenever it gets to it; a
            # free landing inside a module's snapshot lowers that module's count: keep the largest of three forwards
            runs = [forward_memory(model, x, y) for _ in range(3)]
            mem = {k: max(r[k] for r in runs) for k in runs[0]}
        formula = cost.step_bytes(cfg, b, cfg.block_size, n, sequence_parallel=sp, vocab_parallel=vocab)
        got[name] = (sent, mem, formula)
        rows.append([name, sent / 2**10, formula / 2**10, mem["layer_norm"] / 2**10 if not vocab else "-",
                     mem["dropout"] / 2**10 if not vocab else "-"])
    L, h, s = cfg.n_layer, cfg.n_embd, cfg.block_size
    ctx.say(f"GPT L = {L}, h = {h}, b = {b}, s = {s}, dropout {cfg.dropout}, N = {n}: bytes each rank wrote in one "
            f"forward + backward (kernel) beside minidist.tp.cost's formula, and what the forward's layer norms and "
            f"dropouts allocated and kept (torch's MemTracker)")
    ctx.table(["plan", "written KiB", "formula KiB", "layer_norm KiB", "dropout KiB"], rows)
    (tp_sent, tp_mem, tp_f), (sp_sent, sp_mem, sp_f) = got["TP"], got["TP + SP"]
    (tps_sent, _, tps_f), (sps_sent, _, sps_f) = got["TP, vocab split"], got["TP + SP, vocab split"]
    ratio, want, ratio_split, want_split = sp_sent / tp_sent, sp_f / tp_f, sps_sent / tps_sent, sps_f / tps_f
    act = 2 * b * s * h * 4 * (n - 1) / n               # the head's input and the embedding's gradient
    tp_act, sp_act = sum(tp_mem.values()), sum(sp_mem.values())
    ctx.claim(CLAIM.format(ratio=ratio, want=want, act=act / 2**10, extra=(sps_f - tps_f) / 2**10, effect=want - 1,
                           ratio_split=ratio_split, want_split=want_split, n=n, sp=sp_act / 2**10, tp=tp_act / 2**10),
              abs(ratio - want) < 0.01 < want - 1 and abs(ratio_split - want_split) < 0.01
              and abs(sp_f - tp_f - (sps_f - tps_f) - act) < 1 and all(sp_mem[k] * n == tp_mem[k] > 0 for k in tp_mem))

if __name__ == "__main__":
    main_for(run, TITLE)
