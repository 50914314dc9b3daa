"""FSDP full_shard sends 1.5x DDP's bytes, and the extra third is the all_gather in backward.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.fsdp_vs_ddp_bytes

One training step of the same GPT under each engine, phase by phase (after two
warm-up steps, so DDP's one-time bucket rebuild is not counted). Each phase's bytes
are counted twice: by minidist.comm.trace, call by call under the ring model, and by
the kernel (what each process really wrote to gloo's sockets, minidist.comm.kernel_io);
the claim rests on the kernel's count. With S the bytes of the parameters and N ranks:

    DDP            backward: all_reduce of the gradients            2 S (N-1)/N
    shard_grad_op  forward all_gather + backward reduce_scatter     2 S (N-1)/N
    full_shard     the same, plus a second all_gather in backward   (3 S - S_root) (N-1)/N

full_shard frees each unit's parameters after its forward (only activations must
wait for backward), so backward must gather them again: that re-gather is the
extra S (N-1)/N, less the root's (embeddings, tied head, final norm: S_root), whose
forward ends last and whose parameters backward needs first, so they stay gathered
(as FSDP2 keeps its root's). ZeRO-1 (the paper's) splits DDP's all_reduce around the
optimizer step: a reduce_scatter of the gradients in backward, an all_gather of the
updated parameters after the step, S (N-1)/N each: DDP's bytes, moved at other times.
"""

from __future__ import annotations

import torch

from minidist import DDP, FSDP, ShardedOptimizer, comm
from minidist.mesh import hybrid_mesh
from minidist.models.gpt import GPT, Block, GPTConfig
from recipes.lessons.common import Context, kernel_bytes, main_for

TITLE = "FSDP vs DDP bytes: about 1.5x, and the extra is the backward all_gather"

CLAIM = ("full_shard writes {ratio:.3f}x DDP's bytes as the kernel counts them ((3 S - S_root) / 2 S = "
         "{expected:.3f}); the extra is the backward all_gather ({regather:.3f} S(N-1)/N: the forward's less the "
         "root's {root:.3f}); shard_grad_op, which keeps the gathered parameters until backward, writes "
         "{sgo:.3f}x; ZeRO-1 writes {zero:.3f}x, its step's all_gather {zgather:.3f} S(N-1)/N")

PHASES = ("forward", "backward", "step")

ENGINES = ("DDP", "ZeRO-1", "no_shard", "shard_grad_op", "full_shard")


def build(engine: str, cfg: GPTConfig, ctx: Context):
    torch.manual_seed(0)
    net = GPT(cfg)
    if engine == "ZeRO-1":  # the optimizer hooks the gradients itself: no DDP wrapper
        return net, ShardedOptimizer(net.parameters(), torch.optim.AdamW, lr=1e-3)
    if engine == "DDP":
        model = DDP(net)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        # FSDP1's names in FSDP2's arguments: no_shard is a ("replicate", "shard") mesh with shards of one rank
        kw = dict(mesh=hybrid_mesh(ctx.topo, shard=1)) if engine == "no_shard" else {}
        model = FSDP(net, wrap={Block}, reshard_after_forward=engine == "full_shard", **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def config(small: bool) -> GPTConfig:
    return GPTConfig(n_layer=2, n_embd=64, block_size=32) if small else GPTConfig(n_layer=4, n_embd=128, block_size=64)


def measured_step(model, opt, x, y) -> dict[str, tuple[comm.Trace, float]]:
    """One step, phase by phase: (the trace, bytes the kernel saw written) of each phase."""
    held = {}
    phases = {"forward": lambda: held.update(loss=model(x, y)[1]),
              "backward": lambda: held["loss"].backward(),
              "step": lambda: (opt.step(), opt.zero_grad(set_to_none=True))}
    out = {}
    for name in PHASES:
        with comm.trace() as t:
            written = kernel_bytes(phases[name])
        out[name] = (t, written)
    return out


def bytes_of(t: comm.Trace, op: str) -> int:
    return sum(r.sent_bytes for r in t.records if r.op == op)


def measure(engine: str, cfg: GPTConfig, x, y, ctx: Context) -> dict:
    """One engine's steady-state step: traced bytes per (phase, op), totals, and S_root (FSDP)."""
    model, opt = build(engine, cfg, ctx)
    for _ in range(2):
        measured_step(model, opt, x, y)
    m = measured_step(model, opt, x, y)
    trace = {(ph, op): bytes_of(m[ph][0], op) for ph in PHASES
             for op in ("all_gather", "reduce_scatter", "all_reduce")}
    root = model.units[0].shards.padded * 4 if engine in ("no_shard", "shard_grad_op", "full_shard") else 0
    return {"trace": trace, "trace_total": sum(t.sent_bytes for t, _ in m.values()),
            "kernel": {ph: m[ph][1] for ph in PHASES}, "kernel_total": sum(k for _, k in m.values()),
            "root_bytes": root}


def units(ctx: Context, small: bool) -> tuple[int, float, dict[str, dict]]:
    """S, the unit S (N-1)/N, and every engine's measure() at this size (all ranks)."""
    cfg = config(small)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=g)
    S = sum(p.numel() * 4 for p in GPT(cfg).parameters())
    return S, S * (ctx.world - 1) / ctx.world, {e: measure(e, cfg, x, torch.roll(x, -1, dims=1), ctx) for e in ENGINES}


COLUMNS = {"fwd all_gather": ("forward", "all_gather"), "bwd all_gather": ("backward", "all_gather"),
           "bwd reduce_scatter": ("backward", "reduce_scatter"), "bwd all_reduce": ("backward", "all_reduce"),
           "step all_gather": ("step", "all_gather")}
"""Traced columns of the table: (phase, op)."""


def run(ctx: Context) -> None:
    S, unit, res = units(ctx, ctx.small)
    ddp = res["DDP"]["kernel_total"]
    rows = [[e] + [r["trace"][c] / unit for c in COLUMNS.values()]
            + [r["trace_total"] / unit, r["kernel_total"] / unit, r["kernel_total"] / ddp] for e, r in res.items()]
    ctx.say(f"GPT {S / 4 / 1e6:.2f}M params, S = {S / 2**20:.2f} MiB, N = {ctx.world}; bytes per rank in one step, "
            f"in units of S (N-1)/N = {unit / 2**20:.2f} MiB: per call type the trace's ring model "
            f"(minidist.comm.trace), in all also what the kernel saw each process write (mean over ranks)")
    ctx.table(["engine", *COLUMNS, "total (trace)", "total (kernel)", "kernel / DDP"], rows)
    fs = res["full_shard"]
    fwd_gather, regather = fs["trace"]["forward", "all_gather"], fs["trace"]["backward", "all_gather"]
    root = fs["root_bytes"] * (ctx.world - 1) / ctx.world                   # S_root (N-1)/N
    ratio = fs["kernel_total"] / ddp
    expected = 1.5 - root / (2 * unit)                                       # (3 S - S_root) / 2 S
    sgo = res["shard_grad_op"]["kernel_total"] / ddp
    zero = res["ZeRO-1"]["kernel_total"] / ddp
    zgather = res["ZeRO-1"]["kernel"]["step"] / unit
    ctx.claim(CLAIM.format(ratio=ratio, expected=expected, regather=regather / unit, root=root / unit, sgo=sgo,
                           zero=zero, zgather=zgather),
              abs(ratio - expected) < 0.01 and regather == fwd_gather - root and 0 < root < fwd_gather
              and abs(sgo - 1) < 0.01 and abs(zero - 1) < 0.02 and abs(zgather - 1) < 0.02)


if __name__ == "__main__":
    main_for(run, TITLE)
