"""Activation checkpointing (non-reentrant torch.utils.checkpoint) under FSDP, in every placement:

    inside    a Block checkpoints its own inner function (recompute inside the unit's backward)
    around    the parent checkpoints the unit's call: GPTConfig.activation_checkpointing
              (the unit's forward hooks run again inside backward)
    several   the parent checkpoints two units at once (the earlier one is recomputed
              before its own backward starts)

K AdamW steps equal one process without checkpointing and the same FSDP run without it,
for full_shard and shard_grad_op, prefetch on and off; the recompute really runs; each unit
is gathered no more often than without checkpointing and reduced once; nothing stays
gathered after backward. Checkpointing lowers the bytes autograd saves for backward.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from minidist import comm
from minidist.fsdp import FSDP, ShardedState, TrainingState, prefetch_ahead
from minidist.models.gpt import GPT, Block
from tests.common import rank_slice, tiny_gpt_config
from tests.fsdp.helpers import make_opt, max_diff

STEPS = 3
BATCH = 4
PLACEMENTS = ("inside", "around", "several")


class SelfCheckpointingBlock(Block):
    """Placement "inside": the unit's module checkpoints its own computation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(super().forward, x, use_reentrant=False)


class PairCheckpointedGPT(GPT):
    """Placement "several": one checkpoint around each pair of Blocks (two FSDP units)."""

    def forward(self, idx, targets=None):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))

        def run(x, blocks):
            for b in blocks:
                x = b(x)
            return x

        for i in range(0, len(self.blocks), 2):
            x = checkpoint(run, x, self.blocks[i:i + 2], use_reentrant=False)
        logits = self.lm_head(self.ln_f(x))
        return logits, nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_gpt(placement: str | None) -> GPT:
    torch.manual_seed(0)
    if placement == "several":
        return PairCheckpointedGPT(tiny_gpt_config(n_layer=4))
    model = GPT(tiny_gpt_config(n_layer=4, activation_checkpointing=placement == "around"))
    if placement == "inside":
        for b in model.blocks:
            b.__class__ = SelfCheckpointingBlock
    return model


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 31, (BATCH, 8), generator=g), torch.randint(0, 31, (BATCH, 8), generator=g))
            for _ in range(STEPS)]


@functools.lru_cache(maxsize=None)
def reference(world: int) -> dict[str, torch.Tensor]:
    """One process, no checkpointing, the whole batch (as the mean of per-slice gradients)."""
    model = make_gpt(None)
    opt = make_opt(model.parameters())
    for x, y in batches():
        opt.zero_grad()
        for r in range(world):
            model(rank_slice(x, r, world), rank_slice(y, r, world))[1].backward()
        for p in model.parameters():
            p.grad.div_(world)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_fsdp(placement: str | None, strategy: str, prefetch: bool) -> dict:
    model = FSDP(make_gpt(placement), wrap={Block}, reshard_after_forward=strategy == "full_shard")
    if not prefetch:
        prefetch_ahead(model.units, 0, 0)
    opt = make_opt(model.parameters())
    attn_calls = [0]
    for b in model.module.blocks:
        b.attn.register_forward_pre_hook(lambda *_: attn_calls.__setitem__(0, attn_calls[0] + 1))
    calls: list[dict] = []
    for i, (x, y) in enumerate(batches()):
        if i == 1:  # from the first prefetching step on
            model._schedule.peak_live = 0
        opt.zero_grad()
        with comm.trace() as tr:
            model(rank_slice(x), rank_slice(y))[1].backward()
        calls.append({op: int(row["calls"]) for op, row in tr.totals().items()})
        assert all(u.sharded_state is ShardedState.SHARDED and u.training_state is TrainingState.IDLE
                   and not u.shards.is_allocated for u in model.units), model.units
        opt.step()
    return {"params": model.full_state_dict(rank0_only=False), "calls": calls, "attn_calls": attn_calls[0],
            "units": len(model.units), "peak": model.peak_unsharded_units}


def body_equivalence(strategy: str) -> dict:
    out = {}
    for prefetch in (True, False):
        plain = run_fsdp(None, strategy, prefetch)
        for placement in PLACEMENTS:
            ckpt = run_fsdp(placement, strategy, prefetch)
            out[(placement, prefetch)] = {
                "vs_reference": max_diff(ckpt["params"], reference(dist.get_world_size())),
                "vs_plain": max_diff(ckpt["params"], plain["params"]),
                "calls": ckpt["calls"], "plain_calls": plain["calls"],
                "attn_calls": ckpt["attn_calls"], "plain_attn_calls": plain["attn_calls"],
                "units": ckpt["units"], "peak": ckpt["peak"], "plain_peak": plain["peak"]}
    return out


@pytest.mark.parametrize("strategy", ["full_shard", "shard_grad_op"])
def test_checkpointed_fsdp_matches_one_process(run_dist, strategy):
    n_layer = 4
    for per_rank in run_dist(2, body_equivalence, strategy):
        for cfg, r in per_rank.items():
            assert r["vs_reference"] < 1e-6, (strategy, cfg, r["vs_reference"])
            assert r["vs_plain"] < 1e-6, (strategy, cfg, r["vs_plain"])
            # the recompute ran: every block's attention twice per step
            assert r["plain_attn_calls"] == STEPS * n_layer, r
            assert r["attn_calls"] == 2 * STEPS * n_layer, (strategy, cfg, r["attn_calls"])
            # a recomputed unit is gathered when needed, not once more; every unit is reduced once
            assert r["calls"] == r["plain_calls"], (strategy, cfg, r["calls"], r["plain_calls"])
            assert all(c["reduce_scatter"] == r["units"] for c in r["calls"]), (strategy, cfg, r["calls"])
            # prefetch keeps its bound; a pair recomputed together keeps its first unit gathered
            # from the recompute to that unit's own backward (one more, unless it was the prefetched one)
            extra = 1 if cfg[0] == "several" else 0
            assert r["plain_peak"] <= r["peak"] <= r["plain_peak"] + extra, (strategy, cfg, r["peak"], r["plain_peak"])


def _saved_activation_bytes(placement: str | None) -> int:
    """Bytes of non-parameter tensors autograd saves for backward in one forward (deterministic)."""
    model = FSDP(make_gpt(placement), wrap={Block})
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter):
            saved[0] += t.numel() * t.element_size()
        return t

    x, y = batches()[0]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(rank_slice(x), rank_slice(y))[1]
    loss.backward()
    return saved[0]


def body_saved_bytes() -> dict:
    return {p: _saved_activation_bytes(p) for p in (None, *PLACEMENTS)}


def test_checkpointing_saves_activation_memory(run_dist):
    for saved in run_dist(2, body_saved_bytes):
        block_input = (BATCH // 2) * 8 * tiny_gpt_config().n_embd * 4  # fp32 (batch, time, n_embd)
        for placement in PLACEMENTS:
            # what a checkpointed block keeps is about its input; without, many times that
            assert saved[placement] < saved[None] / 3, (placement, saved)
        # around each block: 4 block inputs saved instead of every block's internals
        assert saved[None] - saved["around"] > 4 * 4 * block_input, saved


class ReentrantGPT(GPT):
    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=True)
        logits = self.lm_head(self.ln_f(x))
        return logits, nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def body_reentrant() -> str:
    torch.manual_seed(0)
    model = FSDP(ReentrantGPT(tiny_gpt_config()), wrap={Block})
    x, y = batches()[0]
    try:
        model(rank_slice(x), rank_slice(y))[1].backward()
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_reentrant_checkpoint_is_refused_with_a_clear_error(run_dist):
    for msg in run_dist(2, body_reentrant):
        assert "use_reentrant=False" in msg and "\n" not in msg, msg
