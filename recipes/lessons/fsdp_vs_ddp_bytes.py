"""FSDP full_shard sends 1.5x DDP's bytes, and the extra third is the all_gather in backward.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.fsdp_vs_ddp_bytes

One training step of the same GPT under each engine, traced phase by phase with
minidist.comm.trace (after two warm-up steps, so DDP's one-time bucket rebuild is
not counted). With S the bytes of the parameters and N ranks (ring model):

    DDP            backward: all_reduce of the gradients            2 S (N-1)/N
    shard_grad_op  forward all_gather + backward reduce_scatter     2 S (N-1)/N
    full_shard     the same, plus a second all_gather in backward   (3 S - S_root) (N-1)/N

full_shard frees each unit's parameters after its forward (only activations must
wait for backward), so backward must gather them again: that re-gather is the
extra S (N-1)/N, less the root's (embeddings, tied head, final norm: S_root), whose
forward ends last and whose parameters backward needs first, so they stay gathered
(as FSDP2 keeps its root's). ZeRO-1 keeps DDP's all_reduce and adds the owners'
broadcast of the updated parameters after the optimizer step.
"""

from __future__ import annotations

import torch

from minidist import DDP, FSDP, ShardedOptimizer, comm
from minidist.models.gpt import GPT, Block, GPTConfig
from recipes.lessons.common import Context, main_for

TITLE = "FSDP vs DDP bytes: about 1.5x, and the extra is the backward all_gather"

ENGINES = ("DDP", "ZeRO-1", "no_shard", "shard_grad_op", "full_shard")


def build(engine: str, cfg: GPTConfig):
    torch.manual_seed(0)
    net = GPT(cfg)
    if engine in ("DDP", "ZeRO-1"):
        model = DDP(net)
        opt = (ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3) if engine == "ZeRO-1"
               else torch.optim.AdamW(model.parameters(), lr=1e-3))
    else:
        model = FSDP(net, wrap={Block}, sharding_strategy=engine)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def traced_step(model, opt, x, y) -> dict[str, comm.Trace]:
    with comm.trace() as fwd:
        loss = model(x, y)[1]
    with comm.trace() as bwd:
        loss.backward()
    with comm.trace() as step:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"forward": fwd, "backward": bwd, "step": step}


def bytes_of(t: comm.Trace, op: str) -> int:
    return sum(r.sent_bytes for r in t.records if r.op == op)


def run(ctx: Context) -> None:
    cfg = GPTConfig(n_layer=2, n_embd=64, block_size=32) if ctx.small else GPTConfig(n_layer=4, n_embd=128, block_size=64)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=g)
    y = torch.roll(x, -1, dims=1)
    S = sum(p.numel() * 4 for p in GPT(cfg).parameters())
    unit = S * (ctx.world - 1) / ctx.world            # S (N-1)/N: one all_gather's worth
    rows, total = [], {}
    for engine in ENGINES:
        model, opt = build(engine, cfg)
        for _ in range(2):
            traced_step(model, opt, x, y)
        t = traced_step(model, opt, x, y)
        cols = [bytes_of(t["forward"], "all_gather"), bytes_of(t["backward"], "all_gather"),
                bytes_of(t["backward"], "reduce_scatter"), bytes_of(t["backward"], "all_reduce"),
                bytes_of(t["step"], "broadcast")]
        total[engine] = sum(v.sent_bytes for v in t.values())
        rows.append([engine] + [c / unit for c in cols] + [total[engine] / unit])
        if engine == "full_shard":
            regather, fwd_gather = cols[1], cols[0]
            root = model.units[0].shards.padded * 4 * (ctx.world - 1) / ctx.world  # S_root (N-1)/N
    for row in rows:
        row.append(total[row[0]] / total["DDP"])
    ctx.say(f"GPT {S / 4 / 1e6:.2f}M params, S = {S / 2**20:.2f} MiB, N = {ctx.world}; bytes sent per rank in one "
            f"step, in units of S (N-1)/N = {unit / 2**20:.2f} MiB (minidist.comm.trace)")
    ctx.table(["engine", "fwd all_gather", "bwd all_gather", "bwd reduce_scatter", "bwd all_reduce",
               "step broadcast", "total", "/ DDP"], rows)
    ctx.say("(ZeRO-1's broadcasts count their payload for every rank, the trace's pipelined-chain model; on the "
            "wire each rank receives the S (N-1)/N it does not own)")
    ratio = total["full_shard"] / total["DDP"]
    extra = (total["full_shard"] - total["DDP"]) / total["DDP"]
    expected = 1.5 - root / (2 * unit)  # (3 S - S_root) / 2 S
    ctx.claim(f"full_shard sends {ratio:.3f}x DDP's bytes (1.5 - S_root/2S = {expected:.3f}); the extra "
              f"{extra:.3f}x is the backward all_gather ({regather / unit:.3f} S(N-1)/N: the forward's less the "
              f"root's {root / unit:.3f}); shard_grad_op, which keeps the gathered parameters until backward, "
              f"sends {total['shard_grad_op'] / total['DDP']:.3f}x",
              abs(ratio - expected) < 0.01 and regather == fwd_gather - root and 0 < root < fwd_gather
              and abs(total["shard_grad_op"] / total["DDP"] - 1) < 0.01)


if __name__ == "__main__":
    main_for(run, TITLE)
