"""Context parallelism's bytes grow with the sequence and the layers: the ring on top of DDP's, against TP's.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.cp_vs_tp_bytes     (and --nproc_per_node=4)

The same GPT, one training step per sequence length s (one sequence per step), three ways over
all N ranks:

    DDP  every rank the whole model and its own sequence: one all_reduce of the gradients,
         2 psi e (N-1)/N bytes per rank, whatever s is
    CP   every rank the whole model and 1/N of the one sequence's tokens (minidist.cp, zigzag ring):
         per layer 2 (N-1) blocks of keys and values forward and 4 (N-1) backward (a block is one
         rank's keys, s/N h e bytes), 6 L s h e (N-1)/N, PLUS the same all_reduce of the gradients
         as DDP (the ranks hold the same weights and saw different tokens)
    TP   every rank 1/N of each layer and the whole sequence (minidist.tp): 8 L s h e (N-1)/N

So CP costs DDP's bytes and a ring on top; it is never cheaper than DDP (which, with a batch
to split, is the first choice), but it splits what DDP cannot: one sequence too long for one
rank's memory. Against TP, the other way to split one sequence's work: both grow with the
tokens, CP by 6 L h e (N-1)/N per token, TP by 8, and they cross where 2 L s h = 2 psi, at
s* = psi / (L h) tokens: TP sends less for short sequences, CP for long ones.

Bytes are what the kernel counted each process writing (minidist.comm.kernel_io: gloo's
sockets), mean over ranks, beside the formulas of minidist.cp.cost and minidist.tp.cost; e = 4.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

from minidist import DDP, cp
from minidist.mesh import CP, TP
from minidist.models.gpt import GPT, GPTConfig
from minidist.tp import cost as tp_cost, parallelize_gpt as tp_parallelize
from recipes.lessons.common import Context, main_for
from recipes.lessons.tp_vs_ddp_bytes import crossing, measured

TITLE = "Context parallelism: DDP's bytes plus a ring that grows with s and L; it crosses TP at s* = psi / (L h)"

CLAIM = ("CP's bytes per step grow by {slope:.3f} KiB per token (formula 6 L h e (N-1)/N = {want:.3f} KiB), TP's by "
         "{tp_slope:.3f}; CP minus DDP, the ring, is {ring:.4f}x its formula at s = {s}, and {layers:.3f}x as much at "
         "{two_l} layers as at {l}; CP and TP cross at s = {cross:.0f} tokens, the formula's s* = psi / (L h) = "
         "{predicted:.0f} (kernel-counted, N = {n})")


def config(small: bool, n_layer: int | None = None) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=1024 if small else 2048, n_layer=n_layer or (2 if small else 4),
                     n_head=4, n_embd=32 if small else 64)


def lengths(small: bool) -> list[int]:
    return [256, 512, 1024] if small else [256, 512, 1024, 2048]


def engines(cfg: GPTConfig, n: int, names: tuple[str, ...]) -> dict:
    """The named ways over n ranks, from the same initial weights."""
    built = {}
    for name in names:
        torch.manual_seed(0)
        model = GPT(cfg)
        if name == "cp":
            model = DDP(cp.parallelize_gpt(model, init_device_mesh("cpu", (n,), mesh_dim_names=(CP,))))
        elif name == "tp":
            model = tp_parallelize(model, init_device_mesh("cpu", (n,), mesh_dim_names=(TP,)))
        else:
            model = DDP(model)
        built[name] = model
    return built


def sweep(cfg: GPTConfig, ctx: Context, seqs: list[int], names=("ddp", "cp", "tp")) -> dict[str, list[float]]:
    """Kernel bytes per engine and sequence length."""
    models = engines(cfg, ctx.world, names)
    mesh = init_device_mesh("cpu", (ctx.world,), mesh_dim_names=(CP,))
    out: dict[str, list[float]] = {name: [] for name in models}
    for s in seqs:
        g = torch.Generator().manual_seed(s)
        x = torch.randint(0, cfg.vocab_size, (1, s + 1), generator=g)  # one sequence, the same on every rank
        idx, y = x[:, :-1], x[:, 1:]
        mine = torch.roll(x, ctx.rank, dims=1)  # DDP's ranks read different sequences (the bytes do not care)
        inputs = {"ddp": (mine[:, :-1], mine[:, 1:]), "cp": cp.shard_batch(idx, y, mesh), "tp": (idx, y)}
        for name, model in models.items():
            out[name].append(measured(model, *inputs[name]))
    return out


def run(ctx: Context) -> None:
    cfg, n, seqs = config(ctx.small), ctx.world, lengths(ctx.small)
    psi = sum(p.numel() for p in GPT(cfg).parameters())
    L, h, e, scale = cfg.n_layer, cfg.n_embd, 4, (n - 1) / n
    ddp_formula = 2 * psi * e * scale
    got = sweep(cfg, ctx, seqs)
    rows = []
    for i, s in enumerate(seqs):
        ring = cp.cost.step_bytes(cfg, 1, s, n)
        rows.append([s, got["ddp"][i] / 2**10, ddp_formula / 2**10, got["cp"][i] / 2**10, (ring + ddp_formula) / 2**10,
                     got["tp"][i] / 2**10, tp_cost.step_bytes(cfg, 1, s, n) / 2**10, got["cp"][i] / got["tp"][i]])
    ctx.say(f"GPT L = {L}, h = {h}, psi = {psi / 1e6:.3f}M parameters, N = {n}, one sequence of s tokens per step; "
            f"KiB each rank wrote in one forward + backward (kernel-counted, mean over ranks) beside the formulas")
    ctx.table(["s", "DDP KiB", "DDP formula", "CP KiB", "CP formula", "TP KiB", "TP formula", "CP / TP"], rows)
    deeper = sweep(config(ctx.small, 2 * L), ctx, seqs[-1:], ("ddp", "cp"))  # the ring at 2 L, the longest s
    ring_at = [got["cp"][-1] - got["ddp"][-1], deeper["cp"][0] - deeper["ddp"][0]]
    ring_formula = cp.cost.step_bytes(cfg, 1, seqs[-1], n)
    ctx.say(f"at s = {seqs[-1]}: CP - DDP (the ring) {ring_at[0] / 2**10:.1f} KiB at L = {L}, "
            f"{ring_at[1] / 2**10:.1f} KiB at L = {2 * L} (formula {ring_formula / 2**10:.1f} and "
            f"{2 * ring_formula / 2**10:.1f})")
    span = seqs[-1] - seqs[0]
    slope, tp_slope = (got["cp"][-1] - got["cp"][0]) / span, (got["tp"][-1] - got["tp"][0]) / span
    want = 6 * L * h * e * scale
    cross, predicted = crossing(seqs, got["tp"], got["cp"]), cp.cost.crossing_tokens(psi, L, h)
    ctx.claim(CLAIM.format(slope=slope / 2**10, want=want / 2**10, tp_slope=tp_slope / 2**10,
                           ring=ring_at[0] / ring_formula, s=seqs[-1], layers=ring_at[1] / ring_at[0], two_l=2 * L,
                           l=L, cross=cross, predicted=predicted, n=n),
              abs(slope / want - 1) < 0.02 and abs(ring_at[0] / ring_formula - 1) < 0.02
              and abs(ring_at[1] / ring_at[0] - 2) < 0.04 and abs(cross / predicted - 1) < 0.05)


if __name__ == "__main__":
    main_for(run, TITLE)
