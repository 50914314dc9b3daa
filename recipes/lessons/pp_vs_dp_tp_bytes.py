"""A pipeline sends the least: one activation per micro-batch per stage boundary, and its gradient back.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.pp_vs_dp_tp_bytes     (and --nproc_per_node=4)

The same GPT, one training step on the same b sequences of s tokens, under three ways of using
N ranks:

    PP    each rank some consecutive blocks (minidist.pp, 1F1B, m micro-batches): across each of
          the N-1 boundaries every micro-batch's activation (b/m) s h forward and its gradient
          back, 2 b s h e per boundary whatever m is; plus the tied embedding, whose two copies
          (first and last stage) swap gradients: V h e each. Per rank, the mean:
          2 b s h e (N-1)/N + 2 V h e / N
    TP    each rank 1/N of every layer (minidist.tp): L 8 b s h e (N-1)/N, 4 all_reduces per block
    DDP   each rank everything and its own b sequences: 2 psi e (N-1)/N

PP's bytes are point to point and do not grow with the depth: a block more inside a stage
sends nothing. That is why it is the dimension laid across nodes (the slowest links), with TP
inside a node and DP between. What PP pays instead is time (the bubble, lesson pp_bubble).

Bytes are what the kernel counted each process writing (minidist.comm.kernel_io: gloo's
sockets), the mean over ranks, beside the formulas; e = 4 (fp32).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

from minidist import DDP, pp
from minidist.mesh import PP, TP
from minidist.models.gpt import GPT, GPTConfig
from minidist.tp import cost as tp_cost, parallelize_gpt
from recipes.lessons.common import Context, kernel_bytes, main_for

TITLE = "a pipeline sends one activation per micro-batch per boundary: less than TP's and DDP's"

CLAIM = ("one step of the same GPT on {b} sequences of {s} tokens: PP sent {pp:.1f} KiB per rank (formula "
         "2 b s h e (N-1)/N + 2 V h e / N = {ppf:.1f}), TP {tp:.1f} ({tpf:.1f}), DDP {ddp:.1f} ({ddpf:.1f}) "
         "(kernel-counted, N = {n})")


def config(small: bool) -> GPTConfig:
    return GPTConfig(vocab_size=256, block_size=32, n_layer=4, n_head=4, n_embd=64 if small else 128)


def measured(step) -> float:
    """The least of two counted steps: a write that is not the step's (another thread of the process) only adds
    bytes, and once, under the whole suite's load, added 2 KiB to PP's 128 at N = 4."""
    for _ in range(2):  # gloo's pairs, DDP's bucket rebuild, the pipeline's shapes
        step()
    return min(kernel_bytes(step) for _ in range(2))


def run(ctx: Context) -> None:
    cfg, n, b, m = config(ctx.small), ctx.world, 8, 4
    s, h, e = cfg.block_size, cfg.n_embd, 4
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, cfg.vocab_size, (b, s + 1), generator=g)
    x, y = batch[:, :-1], batch[:, 1:]

    def fresh() -> GPT:
        torch.manual_seed(0)
        return GPT(cfg)

    cut = pp.split_gpt(fresh(), n)
    sched = pp.build("1f1b", n, m)
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=(PP,))
    pipe = pp.Pipeline([pp.Stage(cut.modules[ctx.rank], ctx.rank, n)], sched, mesh, cut.loss_fn, ties=cut.ties)
    tp = parallelize_gpt(fresh(), init_device_mesh("cpu", (n,), mesh_dim_names=(TP,)))
    ddp = DDP(fresh())
    mine = torch.roll(batch, ctx.rank, dims=0)  # DDP's ranks read different sequences (the bytes do not care)

    def clear(module) -> None:
        for q in module.parameters():
            q.grad = None
    got = {"PP": measured(lambda: (pipe.step(x, target=y), clear(cut.modules[ctx.rank]))),
           "TP": measured(lambda: (tp(x, y)[1].backward(), clear(tp))),
           "DDP": measured(lambda: (ddp(mine[:, :-1], mine[:, 1:])[1].backward(), clear(ddp)))}
    psi = sum(q.numel() for q in fresh().parameters())
    want = {"PP": pp.cost.step_bytes(sched, b // m * s * h, e) + 2 * cfg.vocab_size * h * e / n,
            "TP": tp_cost.step_bytes(cfg, b, s, n), "DDP": 2 * psi * e * (n - 1) / n}
    ctx.say(f"GPT L = {cfg.n_layer}, h = {h}, V = {cfg.vocab_size}, psi = {psi / 1e6:.3f}M; b = {b} sequences of "
            f"s = {s} tokens (PP: m = {m} micro-batches); KiB each rank wrote in one step (mean over ranks)")
    ctx.table(["strategy", "KiB measured", "KiB formula", "measured / formula"],
              [[k, got[k] / 2**10, want[k] / 2**10, got[k] / want[k]] for k in got])
    close = all(1.0 <= got[k] / want[k] < 1.02 for k in got)
    ctx.claim(CLAIM.format(b=b, s=s, pp=got["PP"] / 2**10, ppf=want["PP"] / 2**10, tp=got["TP"] / 2**10,
                           tpf=want["TP"] / 2**10, ddp=got["DDP"] / 2**10, ddpf=want["DDP"] / 2**10, n=n),
              close and got["PP"] < min(got["TP"], got["DDP"]))


if __name__ == "__main__":
    main_for(run, TITLE)
