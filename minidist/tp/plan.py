"""The tensor-parallel plan for minidist.models.GPT: Megatron-LM's layout, applied in place.

    tp_mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))     # or mesh["tp"] of a 2-D mesh
    model = parallelize_gpt(GPT(cfg), tp_mesh, sequence_parallel=True, vocab_parallel=True)

As torch's parallelize_module: a model that every rank built alike (same seed) in, the same
model out with some submodules replaced by parallel ones that keep their rank's slice. Per
block (N = tp ranks, b*s tokens of width h):

    ln_1 -> attn.qkv  column-parallel, split by heads (this rank's rows of q, of k, of v)
            attention on n_head/N heads, no communication
         -> attn.proj row-parallel                      f before qkv, g after proj: 1 all_reduce
    ln_2 -> mlp.fc    column-parallel (4h/N hidden units)   forward, 1 backward
         -> mlp.proj  row-parallel                      f before fc, g after proj: the same

Each block moves 2 all_reduces of b*s*h forward and 2 backward: 8 b*s*h (N-1)/N elements per
rank and step, growing with the tokens, not with the parameters (DDP: 2 * params * (N-1)/N).
Norms, residuals, embeddings and the head stay replicated: every rank computes them whole.

sequence_parallel: the replicated parts run on 1/N of the sequence per rank (norms through
SequenceParallelLayerNorm, embeddings scattered, the head fed by an all_gather); each f/g
becomes all_gather/reduce_scatter, the same bytes (minidist.tp.conjugates). The sequence
length must divide by N.

vocab_parallel: the token embedding and the tied head split by vocabulary rows (the tie is
kept: one Parameter, this rank's rows), the loss computed from split logits (minidist.tp.vocab);
the logits the model returns are then this rank's vocabulary columns. To sample
(GPT.generate), use the whole model (minidist.models.load of a finished run).

Dropout: where ranks hold different heads or different tokens, each rank draws its own masks
(minidist.tp.random); elsewhere all tp ranks share the default generator and must be seeded alike.
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist.models.gpt import GPT
from minidist.tp.linear import ColumnParallelLinear, RowParallelLinear
from minidist.tp.placement import tp_group
from minidist.tp.random import RankRandom
from minidist.tp.sequence import SequenceParallelLayerNorm, gather_input, scatter_output
from minidist.tp.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding


def parallelize_gpt(model: GPT, device_mesh: DeviceMesh, *, sequence_parallel: bool = False,
                    vocab_parallel: bool = False) -> GPT:
    """Split `model`'s layers over the 1-D "tp" mesh `device_mesh`, in place; returns `model`."""
    _, _, size = tp_group(device_mesh)
    cfg = model.cfg
    if any(isinstance(m, (ColumnParallelLinear, RowParallelLinear)) for m in model.modules()):
        raise ValueError("parallelize_gpt: this model is already tensor-parallel; parallelize the plain GPT once")
    check_degree(cfg, size, sequence_parallel=sequence_parallel, vocab_parallel=vocab_parallel)
    sp = sequence_parallel
    for block in model.blocks:
        _parallelize_block(block, device_mesh, sp, split_dropout=cfg.dropout > 0)
    _parallelize_ends(model, device_mesh, sp, vocab_parallel)
    if sp and cfg.dropout > 0:
        model.drop = RankRandom(model.drop, device_mesh)
    return model


def check_degree(cfg, size: int, *, sequence_parallel: bool = False, vocab_parallel: bool = False,
                 setting: str = "tp", prefix: str = "") -> None:
    """One line naming `setting` where `size` ranks cannot split a GPT of config `cfg`, with the degrees
    that can: the heads (attention is split by heads, so the width too), the vocabulary
    (vocab_parallel) and the sequence (sequence_parallel). `prefix`: how the config's keys are spelled."""
    rules = [("n_head", "attention is split by heads"), ("n_embd", "the width is split")]
    rules += [("vocab_size", "the vocabulary is split by rows")] if vocab_parallel else []
    rules += [("block_size", "the sequence is split")] if sequence_parallel else []
    for key, why in rules:
        n = getattr(cfg, key)
        if size < 1 or n % size:
            valid = [d for d in range(1, cfg.n_head + 1) if all(getattr(cfg, k) % d == 0 for k, _ in rules)]
            raise ValueError(f"{setting}={size} must divide {prefix}{key}={n} ({why}); "
                             f"valid: {', '.join(map(str, valid))}")


def _parallelize_block(block: nn.Module, mesh: DeviceMesh, sp: bool, split_dropout: bool) -> None:
    attn, mlp = block.attn, block.mlp
    attn.qkv = ColumnParallelLinear(attn.qkv, mesh, parts=3, sequence_parallel=sp)
    attn.proj = RowParallelLinear(attn.proj, mesh, sequence_parallel=sp)
    attn.n_head //= mesh.size()
    mlp.fc = ColumnParallelLinear(mlp.fc, mesh, sequence_parallel=sp)
    mlp.proj = RowParallelLinear(mlp.proj, mesh, sequence_parallel=sp)
    if split_dropout:
        attn.attend = RankRandom(attn.attend, mesh)  # each rank's heads draw their own masks
        if sp:
            mlp.drop = RankRandom(mlp.drop, mesh)  # each rank's tokens too
    if sp:
        block.ln_1 = SequenceParallelLayerNorm(block.ln_1, mesh)
        block.ln_2 = SequenceParallelLayerNorm(block.ln_2, mesh)


def _parallelize_ends(model: GPT, mesh: DeviceMesh, sp: bool, vocab_parallel: bool) -> None:
    """Embeddings, the final norm, the (tied) head and the loss."""
    if vocab_parallel:
        model.wte = VocabParallelEmbedding(model.wte, mesh, sequence_parallel=sp)
        head = ColumnParallelLinear(model.lm_head, mesh, sequence_parallel=sp)
        head.weight = model.wte.weight  # the tie survives: one Parameter, this rank's rows
        model.lm_head = head
        model.criterion = VocabParallelCrossEntropy(model.cfg.vocab_size, mesh)
    elif sp:
        scatter_output(model.wte, mesh, dim=1)  # (b, s, h) -> this rank's (b, s/N, h)
        gather_input(model.lm_head, mesh)  # the replicated head sees the whole sequence
    if sp:
        scatter_output(model.wpe, mesh, dim=0)  # (s, h) positions -> this rank's (s/N, h)
        model.ln_f = SequenceParallelLayerNorm(model.ln_f, mesh)
