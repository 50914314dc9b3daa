"""Worked numbers: one real model's bytes per step and memory per rank under every strategy.

    python -m recipes.worked_numbers                                             # the XL, N = 4 and 8
    torchrun --standalone --nproc_per_node=4 -m recipes.worked_numbers --measure # + measured at N = 4

The model is CS336's XL configuration (d_model 1600, d_ff 6400, 48 layers, 25 heads, vocabulary
10000, context 128) built as minidist's GPT (minidist.models.gpt: a GELU MLP of 4 d_model, biases,
learned positions, the head tied to the embedding), on the meta device: no memory, exact shapes.
From the shapes alone, for fp32 and for mixed precision (bf16 compute and collectives, fp32
masters; AdamW, so K = 8 and K = 12): bytes each rank sends per step under the ring model, every
padding row counted as FSDP lays them out, and the model states each rank keeps (parameters,
gradients, optimizer state: the ZeRO paper's accounting). FSDP's numbers use S_root, the root
unit's bytes (wte, wpe, ln_f; lm_head is tied to wte), and S_unit, one Block's.

The XL does not fit four processes of this 24 GiB machine at 16 bytes a parameter, so --measure
runs a scaled-down model of the same kind (SMALL: 6 layers, width 320, 5 heads of 64, the same
vocabulary and context) at N = 4 under every strategy, and prints beside the same formulas what the
kernel counted each process writing to gloo's sockets in one step (minidist.comm.kernel_io, the
mean over ranks) and the live bytes torch's MemTracker saw after the step's optimizer.step()
(parameters, gradients, optimizer state and engine buffers: the model states).
"""

from __future__ import annotations

import argparse
import math
import warnings
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from minidist.models.gpt import GPT, Block, GPTConfig

XL = GPTConfig(vocab_size=10000, block_size=128, n_layer=48, n_head=25, n_embd=1600)
SMALL = replace(XL, n_layer=6, n_head=5, n_embd=320)
STRATEGIES = ("ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "hybrid_shard")
PRECISIONS = {"fp32": (4, 8), "bf16": (2, 12)}
"""name -> (bytes per element on the wire, K: optimizer-state bytes per parameter)."""
GB, MB = 1e9, 1e6


@dataclass
class Shapes:
    """What the formulas need from a model: every parameter's shape, by FSDP unit."""

    shapes: list[tuple[str, tuple[int, ...]]]      # (unit, shape) of each parameter once (tied: once)
    psi: int
    largest_owner_share: dict[int, int]            # N -> elements of the largest owner-broadcast share

    @classmethod
    def of(cls, cfg: GPTConfig, worlds: tuple[int, ...]) -> "Shapes":
        from minidist.zero import partition_by_numel
        with torch.device("meta"):
            model = GPT(cfg)
        unit_of = {}
        for name, m in model.named_modules():
            if isinstance(m, Block):
                unit_of.update({id(p): name for p in m.parameters()})
        params = list(model.parameters())  # tied lm_head.weight is wte.weight: once
        shapes = [(unit_of.get(id(p), ""), tuple(p.shape)) for p in params]
        share = {}
        for n in worlds:
            owner = partition_by_numel(params, n)
            share[n] = max(sum(p.numel() for p, r in zip(params, owner) if r == k) for k in range(n))
        return cls(shapes, sum(p.numel() for p in params), share)

    def padded(self, n: int, unit: str | None = None) -> int:
        """Elements FSDP lays out at n shard ranks (each parameter padded to n ceil(rows / n) rows)."""
        return sum(n * math.ceil(s[0] / n) * math.prod(s[1:]) for u, s in self.shapes if unit is None or u == unit)

    def unit_elems(self, n: int) -> tuple[int, int]:
        """(S_root, largest S_unit) in elements at n shard ranks."""
        units = {u for u, _ in self.shapes if u}
        return self.padded(n, ""), max(self.padded(n, u) for u in units)


def sent_bytes(strategy: str, sh: Shapes, n: int, e: int, hybrid_shard: int) -> float:
    """Bytes one rank sends per step under the ring model (broadcast: the mean over ranks)."""
    f = (n - 1) / n
    if strategy in ("ddp", "zero1", "zero2"):
        return 2 * sh.psi * e * f          # ZeRO: + under N padding elements per bucket
    if strategy == "zero1_broadcast":        # fp32 parameters whatever the precision (autocast only)
        return 3 * sh.psi * 4 * f
    if strategy == "shard_grad_op":
        return 2 * sh.padded(n) * e * f
    if strategy == "full_shard":
        return (3 * sh.padded(n) - sh.unit_elems(n)[0]) * e * f
    g, r = hybrid_shard, n // hybrid_shard
    s = sh.padded(g) * e
    return (3 * s - sh.unit_elems(g)[0] * e) * (g - 1) / g + 2 * (s / g) * (r - 1) / r


def state_bytes(strategy: str, sh: Shapes, n: int, precision: str, hybrid_shard: int) -> tuple[float, str]:
    """(model-state bytes per rank, the formula): parameters, gradients, optimizer state, engine buffers.

    Mixed precision, as minidist lays it out: DDP keeps the fp32 masters (4), their bf16 copies
    (2), its buckets in reduce_dtype (2), fp32 gradients (4) and the moments (8); ZeRO the bf16
    flat parameters (2), the bf16 gradient buffers (2; ZeRO-2: only while reducing) and per
    partition element the master (4), the moments (8) and the master's fp32 gradient (4), which
    the paper's (2 + 2 + 12) psi leaves out; FSDP holds no 2-byte copy between uses.
    """
    psi = sh.psi
    if precision == "fp32":
        table = {"ddp": (16 * psi, "16 psi"), "zero1": (8 * psi + 8 * psi / n, "8 psi + 8 psi/N"),
                 "zero2": (4 * psi + 12 * psi / n, "4 psi + 12 psi/N")}
    else:
        table = {"ddp": (20 * psi, "(4 + 2 + 2 + 4 + 8) psi"),
                 "zero1": (4 * psi + 16 * psi / n, "(2 + 2) psi + (12 + 4) psi/N"),
                 "zero2": (2 * psi + 16 * psi / n, "2 psi + (12 + 4) psi/N")}
    if strategy in table:
        return table[strategy]
    if strategy == "zero1_broadcast":
        return 8 * psi + 8 * sh.largest_owner_share[n], "8 psi + 8 x largest share"
    if strategy == "hybrid_shard":
        return 16 * sh.padded(hybrid_shard) / hybrid_shard, "16 psi/G"
    return 16 * sh.padded(n) / n, "16 psi/N"


def xl_tables(worlds=(4, 8)) -> None:
    """Print the XL's tables (every number decided by the shapes: scripts/docs_facts.py holds them to the code)."""
    sh = Shapes.of(XL, worlds)
    root, unit = sh.unit_elems(worlds[0])
    print(f"model: CS336's XL in minidist's GPT: d_model {XL.n_embd}, d_ff {4 * XL.n_embd}, {XL.n_layer} layers,\n"
          f"{XL.n_head} heads, vocabulary {XL.vocab_size}, context {XL.block_size}")
    print(f"psi = {sh.psi / 1e9:.3f}B parameters; S = {4 * sh.psi / GB:.2f} GB in fp32;\none Block (S_unit) "
          f"{sh.unit_elems(1)[1] / 1e6:.2f}M parameters, the root (S_root: wte, wpe, ln_f) "
          f"{sh.padded(1, '') / 1e6:.2f}M")
    for precision, (e, k) in PRECISIONS.items():
        print(f"\n{precision}: collectives in {e}-byte elements; hybrid_shard: shard groups of G = N/2")
        header = f"{'GB sent per step':<17}" + "".join(f"{f'N = {n}':>9}{'x DDP':>7}" for n in worlds)
        print(header + "\n" + "-" * len(header))
        for strategy in STRATEGIES:
            sent = [sent_bytes(strategy, sh, n, e, n // 2) for n in worlds]
            print(f"{strategy:<17}" + "".join(f"{b / GB:>9.2f}{b / sent_bytes('ddp', sh, n, e, n // 2):>7.2f}"
                                               for b, n in zip(sent, worlds)))
        print(f"\n{precision}: model states per rank, AdamW's K = {k} bytes per parameter")
        header = f"{'GB per rank':<17}" + "".join(f"{f'N = {n}':>9}" for n in worlds) + "  formula"
        print(header + "\n" + "-" * (len(header) + 24))
        for strategy in STRATEGIES:
            cells = [state_bytes(strategy, sh, n, precision, n // 2) for n in worlds]
            print(f"{strategy:<17}" + "".join(f"{b / GB:>9.2f}" for b, _ in cells) + f"  {cells[-1][1]}")


# ------------------------------------------------------------------------------ measured at N = 4

def build(strategy: str, precision: str, cfg: GPTConfig, topo):
    """(model, optimizer) under `strategy`: the engines built directly, as a user would."""
    from minidist import DDP, FSDP, ShardedOptimizer
    from minidist.mesh import hybrid_mesh
    from minidist.precision import MixedPrecisionPolicy
    torch.manual_seed(0)
    model = GPT(cfg)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if precision == "bf16" else None
    adamw = dict(lr=1e-4)
    if strategy == "ddp":
        model = DDP(model, mp_policy=policy)
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    if strategy.startswith("zero"):
        kw = dict(owner_broadcast=True) if strategy == "zero1_broadcast" else dict(stage=int(strategy[4]))
        return model, ShardedOptimizer(model.parameters(), torch.optim.AdamW, mp_policy=policy,
                                       module=model if policy else None, **kw, **adamw)
    shard = {"hybrid_shard": topo.world_size // 2, "no_shard": 1}.get(strategy)  # FSDP2: HSDP; shards of one rank
    kw = dict(mesh=hybrid_mesh(topo, shard)) if shard else {}
    model = FSDP(model, wrap={Block}, reshard_after_forward=strategy in ("full_shard", "hybrid_shard"),
                 mp_policy=policy, **kw)
    return model, torch.optim.AdamW(model.parameters(), **adamw)


def measure(cfg: GPTConfig) -> None:
    """Every strategy at this world size: kernel bytes of one step, MemTracker's live bytes after step()."""
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker

    from minidist import runtime
    from recipes.lessons.common import kernel_bytes
    with runtime.distributed("gloo", timeout_s=300) as topo:
        torch.set_num_threads(1)
        n = topo.world_size
        sh = Shapes.of(cfg, (n,))
        g = torch.Generator().manual_seed(topo.rank)
        idx = torch.randint(cfg.vocab_size, (4, cfg.block_size), generator=g)
        tgt = torch.randint(cfg.vocab_size, (4, cfg.block_size), generator=g)

        def step(model, opt, zero=True):
            model(idx, tgt)[1].backward()
            opt.step()
            if zero:
                opt.zero_grad(set_to_none=True)

        rows = []
        for precision, (e, _) in PRECISIONS.items():
            for strategy in STRATEGIES:
                if strategy == "zero1_broadcast" and precision == "bf16":
                    continue  # it keeps fp32 parameters and relies on autocast: the fp32 row is its row
                mt = MemTracker()
                with warnings.catch_warnings(), mt:  # MemTracker warns about the None grads it is handed
                    warnings.simplefilter("ignore", UserWarning)  # everything the engine allocates, from the model's construction on (one step:
                    model, opt = build(strategy, precision, cfg, topo)  # MemTracker follows one iteration)
                    step(model, opt, zero=False)
                    live = mt.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
                opt.zero_grad(set_to_none=True)
                step(model, opt)  # a second warm-up step: DDP and ZeRO's buckets rebuilt, as every later step
                sent = kernel_bytes(lambda: step(model, opt))
                live = torch.tensor(float(live))
                dist.all_reduce(live, dist.ReduceOp.MAX)
                rows.append((strategy, precision, sent_bytes(strategy, sh, n, e, n // 2), sent,
                             state_bytes(strategy, sh, n, precision, n // 2)[0], float(live)))
                del model, opt
        if topo.rank == 0:
            print(f"measured: {sh.psi / 1e6:.2f}M parameters (n_layer {cfg.n_layer}, n_embd {cfg.n_embd}, n_head "
                  f"{cfg.n_head}, vocabulary {cfg.vocab_size}, context {cfg.block_size}), N = {n}, gloo, batch 4 x "
                  f"{cfg.block_size} tokens per rank\nformula, kernel: MB sent per rank in one step (kernel: what "
                  f"the kernel saw each process write, mean over ranks)\nstates, live: model states per rank (live: "
                  f"MemTracker's live bytes after optimizer.step(), largest rank)")
            header = (f"{'MB':<16}{'precision':>10}{'formula':>9}{'kernel':>9}{'ratio':>7}"
                      f"{'states':>9}{'live':>9}{'ratio':>7}")
            print(header)
            print("-" * len(header))
            for strategy, precision, f_sent, k_sent, f_state, live in rows:
                print(f"{strategy:<16}{precision:>10}{f_sent / MB:>9.2f}{k_sent / MB:>9.2f}{k_sent / f_sent:>7.3f}"
                      f"{f_state / MB:>9.2f}{live / MB:>9.2f}{live / f_state:>7.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="also measure SMALL at this world size (torchrun)")
    args = ap.parse_args()
    if not args.measure:
        xl_tables()
        return
    measure(SMALL)


if __name__ == "__main__":
    main()
