"""The vocabulary split over the tp ranks: the token embedding, the output head (tied to it) and the loss.

A GPT's largest single weight is often the (vocab, width) embedding, used twice when the
head is tied to it. Megatron-LM splits it by rows: rank r holds tokens [start, end).

    embedding   each rank looks up the tokens it owns, zeros for the others; the sum over
                ranks (g: all_reduce, or reduce_scatter along the sequence under SP) is the
                lookup of every token: b*s*h elements, as one more TP all_reduce.
    head        a column-parallel linear on the same rows: logits split by vocabulary,
                (b, s, vocab/N) per rank, never gathered.
    loss        cross-entropy from split logits, with per-token scalars only:
                    m   = max over ranks of the local max logit           all_reduce MAX (b*s)
                    z   = logit of the target, from the rank that owns it  } one all_reduce SUM
                    Z   = sum over ranks of sum_v exp(logit_v - m)         }  of 2*b*s
                    loss = log Z - (z - m)
                backward is local: softmax - one_hot(target) on this rank's columns.

The head's input enters through f (an all_reduce of b*s*h backward, as any column-parallel
layer); the loss moves 3*b*s numbers, never the b*s*vocab logits. The logits the model
returns are this rank's columns.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.tp.conjugates import reduce_from_tp, reduce_scatter_sequence
from minidist.tp.placement import sharded_parameter, tp_group


def vocab_range(vocab_size: int, rank: int, size: int) -> tuple[int, int]:
    """The tokens [start, end) that rank `rank` of `size` owns."""
    if vocab_size % size:
        raise ValueError(f"a vocabulary of {vocab_size} does not split over tp={size} ranks; "
                         f"use a vocab_size divisible by {size} or leave the vocabulary unsplit")
    n = vocab_size // size
    return rank * n, (rank + 1) * n


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of `embedding`; the lookup of every token is the sum over ranks of each rank's lookups."""

    def __init__(self, embedding: nn.Embedding, device_mesh: DeviceMesh, *, sequence_parallel: bool = False):
        super().__init__()
        self.group, rank, size = tp_group(device_mesh)
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.start, self.end = vocab_range(self.num_embeddings, rank, size)
        self.sequence_parallel = sequence_parallel
        self.weight = sharded_parameter(embedding.weight, 0, rank, size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        other = (idx < self.start) | (idx >= self.end)  # tokens another rank owns
        out = F.embedding((idx - self.start).masked_fill(other, 0), self.weight)
        out = out.masked_fill(other.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_sequence(out, self.group)
        return reduce_from_tp(out, self.group)

    def extra_repr(self) -> str:
        return f"tokens [{self.start}, {self.end}) of {self.num_embeddings}, dim={self.embedding_dim}"


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, start, group):
        # logits: (tokens, vocab/N), this rank's columns; target: (tokens,) global ids
        ctx.dtype = logits.dtype
        logits = logits.float()  # the loss in fp32 whatever the compute dtype, as the softmax needs
        m = logits.max(dim=-1).values
        comm.all_reduce(m, comm.ReduceOp.MAX, group=group)
        shifted = logits - m.unsqueeze(-1)
        other = (target < start) | (target >= start + logits.shape[-1])
        local_target = (target - start).masked_fill(other, 0)
        exp = shifted.exp()
        sums = torch.stack([shifted.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(other, 0.0),
                            exp.sum(dim=-1)])
        comm.all_reduce(sums, group=group)  # [target logit - m, sum of exp(logit - m)], summed over ranks
        target_logit, z = sums.unbind(0)
        ctx.save_for_backward(exp.div_(z.unsqueeze(-1)), local_target, other)
        return z.log() - target_logit

    @staticmethod
    def backward(ctx, grad):
        softmax, local_target, other = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(1, local_target.unsqueeze(1), -(~other).to(g.dtype).unsqueeze(1))
        return (g * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, start: int, group) -> torch.Tensor:
    """Per-token cross-entropy from this rank's logit columns [start, start + logits.shape[-1])."""
    return _VocabParallelCrossEntropy.apply(logits, target, start, group)


class VocabParallelCrossEntropy(nn.Module):
    """nn.CrossEntropyLoss (mean over the targets that are not ignore_index) for logits split by vocabulary
    over the tp ranks."""

    def __init__(self, vocab_size: int, device_mesh: DeviceMesh, ignore_index: int = -100):
        super().__init__()
        self.group, rank, size = tp_group(device_mesh)
        self.start, _ = vocab_range(vocab_size, rank, size)
        self.ignore_index = ignore_index

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        keep = target != self.ignore_index  # an ignored target is no rank's column: its loss is masked out
        per_token = vocab_parallel_cross_entropy(logits, target, self.start, self.group)
        return per_token.masked_fill(~keep, 0.0).sum() / keep.sum()
