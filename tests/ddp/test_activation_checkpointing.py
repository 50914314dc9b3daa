"""Activation checkpointing (GPTConfig.activation_checkpointing: non-reentrant checkpoint around
every Block call) under minidist.DDP, ZeRO-1 and ZeRO-2 (ShardedOptimizer): K AdamW steps equal
one process without checkpointing, and the recompute really runs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist.ddp import DDP
from minidist.models.gpt import GPT
from minidist.zero import ShardedOptimizer
from tests.common import rank_slice, seeded, tiny_gpt_config

STEPS, BATCH = 3, 4


def _gpt(checkpointing: bool) -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_gpt_config(n_layer=3, activation_checkpointing=checkpointing))


def _batches():
    g = seeded(1)
    return [(torch.randint(0, 31, (BATCH, 8), generator=g), torch.randint(0, 31, (BATCH, 8), generator=g))
            for _ in range(STEPS)]


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pb = dict(b.named_parameters())
    return max((p - pb[n]).abs().max().item() for n, p in a.named_parameters())


def _body() -> dict:
    world = dist.get_world_size()
    ref = _gpt(False)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=1e-6)
    for x, y in _batches():  # one process, the whole batch: the mean of the per-slice gradients
        ref_opt.zero_grad()
        for r in range(world):
            ref(rank_slice(x, r, world), rank_slice(y, r, world))[1].backward()
        for p in ref.parameters():
            p.grad.div_(world)
        ref_opt.step()
    out = {}
    for name in ("ddp", "zero1", "zero2"):
        model = DDP(_gpt(True)) if name == "ddp" else _gpt(True)
        opt = (torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-6) if name == "ddp" else
               ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2, eps=1e-6, stage=int(name[-1])))
        attn_calls = [0]
        for b in getattr(model, "module", model).blocks:
            b.attn.register_forward_pre_hook(lambda *_: attn_calls.__setitem__(0, attn_calls[0] + 1))
        for x, y in _batches():
            opt.zero_grad()
            model(rank_slice(x), rank_slice(y))[1].backward()
            opt.step()
        out[name] = (_max_diff(getattr(model, "module", model), ref), attn_calls[0])
    return out


def test_checkpointed_ddp_and_zero_match_one_process(run_dist):
    for per_rank in run_dist(2, _body):
        for name, (diff, attn_calls) in per_rank.items():
            assert diff < 1e-6, (name, diff)
            assert attn_calls == 2 * STEPS * 3, (name, attn_calls)  # forward + recompute, every block
