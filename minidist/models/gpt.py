"""A small decoder-only transformer (GPT), the model the recipes train.

Pre-norm blocks of causal self-attention and an MLP, learned positions, and an
output head tied to the token embedding (one shared weight: the engines must
reduce it once). `Block` is the natural FSDP unit: wrap={Block}. With
activation_checkpointing the parent checkpoints each Block's call, as Hugging
Face models do (under FSDP, the unit is recomputed, re-gathered, inside backward).

minidist.tp.parallelize_gpt splits it in place (Megatron-LM's layout): the pieces it
swaps are submodules here, so the forward below reads the same either way. The attention
counts its heads from `n_head` (the plan sets this rank's share) and takes the sequence
length from qkv's output (under sequence parallelism its input holds a chunk); the random
step inside the heads is its own module (CausalAttention); the loss is the `criterion`
module (a vocabulary-parallel plan swaps it). None of these has parameters: state_dict keys
and results are those of the plain model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from minidist.models import emulated


@dataclass
class GPTConfig:
    vocab_size: int = 256
    """Tokens; 256 for byte-level text."""
    block_size: int = 128
    """Longest context, in tokens."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 128
    """Width of the residual stream."""
    dropout: float = 0.0
    """Dropout probability (0 keeps runs deterministic)."""
    activation_checkpointing: bool = False
    """Recompute each Block's activations in backward instead of keeping them (non-reentrant
    torch.utils.checkpoint around every Block call): activation memory of a block falls to its
    input, for one more forward of every block per step."""
    emulate_flops_per_s: float = 0.0
    """> 0: every matmul also sleeps its FLOPs at this rate, forward and 2 x backward (minidist.models.emulated),
    so that a step's time is FLOPs / rate as on an accelerator; 0: off. Attention is counted on the keys the
    rank holds (under context parallelism, its own chunk's: the ring's other blocks are not emulated)."""


class CausalSelfAttention(nn.Module):
    """Heads attend in parallel: q, k, v from one fused projection laid out [q | k | v], then the output projection.

    `n_head` counts the heads this module computes: all of them in the plain model,
    n_head / tp once minidist.tp splits the heads over ranks (qkv then holds this rank's
    rows of q, of k and of v; proj the matching input columns).
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_head={cfg.n_head} must divide n_embd={cfg.n_embd}")
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attend = CausalAttention(cfg.dropout)
        self.width, self.emulate = cfg.n_embd, cfg.emulate_flops_per_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, kernel = emulated.begin(x, self.emulate)
        qkv = self.qkv(x)  # (batch, time, 3 * heads * head_dim)
        b, t, _ = qkv.shape  # t from qkv: under sequence parallelism x holds 1/tp of the sequence, qkv all of it
        # (b, t, heads * head_dim) -> (b, heads, t, head_dim)
        q, k, v = (z.view(b, t, self.n_head, self.head_dim).transpose(1, 2) for z in qkv.chunk(3, dim=2))
        y = self.attend(q, k, v)
        y = self.proj(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim))
        local = self.n_head * self.head_dim  # this rank's heads' width (h / tp)
        # qkv and proj: 2 b t h (3 + 1) h_local; causal q k^T and a v: 2 x 2 b t (t / 2) h_local
        return emulated.end(y, kernel, 8 * b * t * self.width * local + 2 * b * t * t * local, x)


class CausalAttention(nn.Module):
    """softmax(q k^T / sqrt(head_dim), causal) v, with dropout on the attention weights; no parameters.

    A module of its own because its dropout is the one random step inside the heads: a
    tensor-parallel plan wraps it so that each rank's heads draw their own masks
    (minidist.tp.random), as the plain model's heads do.
    """

    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.width, self.emulate = cfg.n_embd, cfg.emulate_flops_per_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, kernel = emulated.begin(x, self.emulate)
        hidden = self.fc(x)  # (b, t, 4 h_local): under sequence parallelism t is the whole sequence
        y = self.drop(self.proj(F.gelu(hidden)))
        return emulated.end(y, kernel, 4 * hidden.numel() * self.width, x)  # fc and proj: 2 x 2 b t h 4h_local


class Block(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x)): one FSDP unit."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def head_logits(cfg: GPTConfig, ln_f: nn.Module, lm_head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The final norm and the (tied) head: logits of this rank's vocabulary, 2 b t h V_local FLOPs (the
    pipeline's last stage calls it too, minidist.pp.stage)."""
    x, kernel = emulated.begin(x, cfg.emulate_flops_per_s)
    logits = lm_head(ln_f(x))
    return emulated.end(logits, kernel, 2 * logits.numel() * cfg.n_embd, x)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one parameter, two uses
        self.criterion = nn.CrossEntropyLoss()  # a module, so a parallel plan can swap it (vocabulary-parallel loss)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx: (batch, time) token ids. Returns logits (batch, time, vocab) and the mean loss if targets."""
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds block_size={self.cfg.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        recompute = self.cfg.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        logits = head_logits(self.cfg, self.ln_f, self.lm_head, x)
        loss = None
        if targets is not None:
            loss = self.criterion(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample max_new_tokens continuations of idx (batch, time), one token at a time."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.cfg.block_size:]
            logits, _ = self(ctx)
            logits = logits[:, -1, :] / max(temperature, 1e-6)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
