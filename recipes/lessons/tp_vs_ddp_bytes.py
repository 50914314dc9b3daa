"""Tensor parallelism's bytes grow with the activations, DDP's with the parameters: where they cross.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.tp_vs_ddp_bytes     (and --nproc_per_node=4)

The same GPT, one training step per batch size b (sequences of s tokens), under two engines
over all N ranks:

    DDP   every rank the whole model, its own b sequences: one all_reduce of the gradients,
          2 psi e (N-1)/N bytes per rank, whatever b is
    TP    every rank 1/N of each layer, the same b sequences (minidist.tp, Megatron's layout):
          per block 2 all_reduces of the (b, s, h) activations forward and 2 of their
          gradients backward, L * 8 b s h e (N-1)/N, nothing that depends on psi

(plus a fixed cost per collective, gloo's headers: the slope in b is what the claim checks).
So TP sends less for small batches and more for large ones, and the two cross where
8 L b s h = 2 psi: at b* = psi / (4 L h s) sequences. For a transformer psi ~ 12 L h^2, so
b* s ~ 3 h tokens. The crossing is a fact about bytes, not TP's pay-off: TP is chosen for
memory (1/N of every weight, its gradient and state, and of the activations inside its
regions), and its collectives block every layer whatever the batch (the next layer needs
their result), where DDP's all_reduce hides behind backward: which is why TP lives inside a
node (fast links) and data parallelism across.

Bytes are what the kernel counted each process writing (minidist.comm.kernel_io: gloo's
sockets), mean over ranks, beside the formulas; e = 4 (fp32).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

from minidist import DDP
from minidist.mesh import TP
from minidist.models.gpt import GPT, GPTConfig
from minidist.tp import cost, parallelize_gpt
from recipes.lessons.common import Context, kernel_bytes, main_for

TITLE = "TP's bytes grow with the batch, DDP's with the parameters; they cross at b* = psi / (4 L h s)"

CLAIM = ("TP's bytes per step grow by {slope:.1f} KiB per sequence of the batch (formula 8 L s h e (N-1)/N = "
         "{want:.1f} KiB), DDP's stay at 2 psi e (N-1)/N ({ddp_growth:.3f}x from b = {b0} to b = {b1}); they cross at "
         "b = {cross:.2f} sequences of {s} tokens, the formula's b* = psi / (4 L h s) = {predicted:.2f} "
         "(kernel-counted, N = {n})")


def config(small: bool) -> GPTConfig:
    return GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64 if small else 128)


def batch_sizes(small: bool) -> list[int]:
    return [1, 4, 16] if small else [1, 2, 4, 8, 16, 32]


def step(model, x, y) -> None:
    model(x, y)[1].backward()
    for p in model.parameters():
        p.grad = None


def measured(model, x, y) -> float:
    """Kernel bytes of one forward + backward, after two unmeasured ones (gloo's pairs, DDP's bucket rebuild)."""
    for _ in range(2):
        step(model, x, y)
    return kernel_bytes(lambda: step(model, x, y))


def crossing(batches: list[int], tp: list[float], ddp: list[float]) -> float:
    """The batch size where TP's bytes reach DDP's, interpolated linearly between the bracketing sizes."""
    for (b0, t0, d0), (b1, t1, d1) in zip(zip(batches, tp, ddp), zip(batches[1:], tp[1:], ddp[1:])):
        if t0 <= d0 and t1 >= d1:
            return b0 + (b1 - b0) * (d0 - t0) / ((t1 - t0) - (d1 - d0))
    return float("nan")


def run(ctx: Context) -> None:
    cfg, n = config(ctx.small), ctx.world
    batches = batch_sizes(ctx.small)
    torch.manual_seed(0)
    ddp = DDP(GPT(cfg))
    torch.manual_seed(0)
    tp = parallelize_gpt(GPT(cfg), init_device_mesh("cpu", (n,), mesh_dim_names=(TP,)))
    psi = sum(p.numel() for p in GPT(cfg).parameters())
    L, h, s, e, scale = cfg.n_layer, cfg.n_embd, cfg.block_size, 4, (n - 1) / n
    ddp_formula = 2 * psi * e * scale
    rows, tp_bytes, ddp_bytes = [], [], []
    for b in batches:
        g = torch.Generator().manual_seed(b)
        x = torch.randint(0, cfg.vocab_size, (b, s + 1), generator=g)  # the same on every rank: TP's ranks share it
        mine = torch.roll(x, ctx.rank, dims=0)  # DDP's ranks read different sequences (the bytes do not care)
        tp_bytes.append(measured(tp, x[:, :-1], x[:, 1:]))
        ddp_bytes.append(measured(ddp, mine[:, :-1], mine[:, 1:]))
        tp_formula = cost.step_bytes(cfg, b, s, n)
        rows.append([b, b * s, tp_bytes[-1] / 2**10, tp_formula / 2**10, ddp_bytes[-1] / 2**10, ddp_formula / 2**10,
                     tp_bytes[-1] / ddp_bytes[-1]])
    predicted = psi / (4 * L * h * s)
    ctx.say(f"GPT L = {L}, h = {h}, s = {s}, psi = {psi / 1e6:.3f}M parameters, N = {n}; bytes each rank wrote in "
            f"one forward + backward (KiB, kernel-counted, mean over ranks) beside the formulas")
    ctx.table(["b", "tokens", "TP KiB", "TP formula", "DDP KiB", "DDP formula", "TP / DDP"], rows)
    cross = crossing(batches, tp_bytes, ddp_bytes)
    # the slope: what one more sequence costs (each collective's fixed cost, gloo's headers, cancels)
    slope, want = (tp_bytes[-1] - tp_bytes[0]) / (batches[-1] - batches[0]), cost.activation_bytes(cfg, 1, s, n)
    flat = all(abs(d / ddp_formula - 1) < 0.02 for d in ddp_bytes)
    ctx.claim(CLAIM.format(slope=slope / 2**10, want=want / 2**10, ddp_growth=ddp_bytes[-1] / ddp_bytes[0],
                           b0=batches[0], b1=batches[-1], cross=cross, s=s, predicted=predicted, n=n),
              abs(slope / want - 1) < 0.02 and flat and abs(cross / predicted - 1) < 0.05)


if __name__ == "__main__":
    main_for(run, TITLE)
