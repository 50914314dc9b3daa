"""Models, data and a reference trainer shared by the FSDP tests.

Every rank builds the same model and batches from a seed; the reference is one
process training the plain module on the whole batch, which data-parallel
training on rank slices must reproduce (mean loss per rank, gradients averaged).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from minidist.fsdp import FSDP
from minidist.models.gpt import GPT, Block
from tests.common import MLP, TiedLM, rank_slice, seeded, tiny_gpt_config

BATCH = 12  # divides 2, 3 and 4 ranks
STEPS = 3


class Twice(nn.Module):
    """A unit (`shared`) called twice in one forward, a frozen layer, and a parameter outside every unit."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(7, 9)
        self.shared = nn.Linear(9, 9)
        self.frozen = nn.Linear(9, 9)
        self.frozen.requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(9))
        self.out = nn.Linear(9, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.shared(h))
        h = torch.tanh(self.frozen(h)) * self.scale
        return self.out(torch.tanh(self.shared(h)))


def make_model(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "mlp":
        return MLP()
    if kind == "tied":
        return TiedLM()
    if kind == "twice":
        return Twice()
    if kind == "gpt":
        return GPT(tiny_gpt_config())
    raise ValueError(kind)


WRAPS = {"mlp": {nn.Linear}, "tied": {nn.Linear}, "twice": {nn.Linear}, "gpt": {Block}}


def make_batches(kind: str, steps: int = STEPS, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = seeded(seed)
    out = []
    for _ in range(steps):
        if kind == "mlp":
            out.append((torch.randn(BATCH, 13, generator=g), torch.randn(BATCH, 5, generator=g)))
        elif kind == "twice":
            out.append((torch.randn(BATCH, 7, generator=g), torch.randn(BATCH, 3, generator=g)))
        elif kind == "tied":
            out.append((torch.randint(0, 29, (BATCH, 6), generator=g), torch.randint(0, 29, (BATCH, 6), generator=g)))
        else:
            out.append((torch.randint(0, 31, (BATCH, 8), generator=g), torch.randint(0, 31, (BATCH, 8), generator=g)))
    return out


def loss_of(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if kind == "gpt":
        return model(x, y)[1]
    out = model(x)
    if kind == "tied":
        return F.cross_entropy(out.reshape(-1, out.size(-1)).float(), y.reshape(-1))
    return F.mse_loss(out.float(), y)


def fsdp2_args(strategy: str) -> dict:
    """FSDP2's arguments for one of the recipes' FSDP1 names, as minidist.parallel.parallelize maps them
    (hybrid_shard: pass mesh=hybrid_mesh(topo, shard=G) too). A collective for no_shard (its mesh)."""
    from minidist import runtime
    from minidist.mesh import hybrid_mesh
    if strategy == "no_shard":  # HSDP with shards of one rank: every rank replicates everything
        return {"mesh": hybrid_mesh(runtime.init("gloo"), shard=1), "reshard_after_forward": False}
    return {"reshard_after_forward": strategy in ("full_shard", "hybrid_shard")}


def make_opt(params) -> torch.optim.Optimizer:
    # eps=1e-6, not 1e-8: a gradient that is zero in exact arithmetic (attention's key bias) is
    # rounding noise whose value depends on the order ranks are summed in (the ring at 3 ranks);
    # AdamW turns it into an update of lr * g / eps, so eps bounds that noise's effect.
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, eps=1e-6)


def train(kind: str, model: nn.Module, batches, shard: bool, steps: int | None = None,
          clip: float | None = None) -> torch.optim.Optimizer:
    """K AdamW steps; `shard` feeds this rank's slice of each batch."""
    opt = make_opt([p for p in model.parameters() if p.requires_grad])
    for x, y in batches[:steps]:
        if shard:
            x, y = rank_slice(x), rank_slice(y)
        opt.zero_grad()
        loss_of(kind, model, x, y).backward()
        if clip is not None:
            (model.clip_grad_norm_ if isinstance(model, FSDP) else
             lambda m: torch.nn.utils.clip_grad_norm_(model.parameters(), m))(clip)
        opt.step()
    return opt


def reference(kind: str, world: int, steps: int = STEPS, clip: float | None = None) -> dict[str, torch.Tensor]:
    """One process, the whole batch: the gradient of the mean loss, computed as the mean of the
    per-slice gradients (mathematically the same). Why slices: attention's key bias has an exactly
    zero true gradient whose rounding noise depends on how the batch is split, and AdamW divides
    by |g| (up to eps), so that noise would otherwise dominate a 1e-6 comparison."""
    model = make_model(kind)
    opt = make_opt([p for p in model.parameters() if p.requires_grad])
    for x, y in make_batches(kind)[:steps]:
        opt.zero_grad()
        for r in range(world):
            loss_of(kind, model, rank_slice(x, r, world), rank_slice(y, r, world)).backward()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(world)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        assert a[k].shape == b[k].shape, (k, a[k].shape, b[k].shape)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
