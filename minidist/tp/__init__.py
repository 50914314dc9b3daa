"""minidist.tp: tensor and sequence parallelism, split the layers instead of the batch.

    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=(minidist.mesh.TP,))
    model = minidist.tp.parallelize_gpt(GPT(cfg), mesh, sequence_parallel=False, vocab_parallel=False)
    logits, loss = model(idx, targets)      # every tp rank: the same batch, the same loss
    loss.backward()                         # each rank: gradients of its slices

Read in this order:
  conjugates.py  the autograd pairs f / g (identity / all_reduce and back) and SP's
                 all_gather / reduce_scatter along the sequence, with the bytes per block
  linear.py      column- and row-parallel Linear: Megatron-LM's pair, one f and one g per pair
  vocab.py       the vocabulary split: embedding, tied head, cross-entropy from split logits
  sequence.py    sequence parallelism outside the linears: norms, entering and leaving the split sequence
  random.py      dropout: which masks the ranks share and which they must not
  placement.py   each slice's declaration over "tp" (minidist.sharding) and the tp group
  plan.py        parallelize_gpt: the layout for minidist.models.GPT
  cost.py        every collective of the plan's step, and its bytes, by formula

With data parallelism on a 2-D mesh (strategy.tp_size in the recipes): minidist.parallel.parallelize
applies parallelize_gpt over layout["tp"] first, then DDP, ZeRO or FSDP over "dp".

Bytes per rank and step, per transformer block (b*s tokens, width h, N ranks, element size e):
TP sends 2 all_reduces of b*s*h forward and 2 backward, 4 * 2 b*s*h*e (N-1)/N; SP the same
bytes as 4 all_gathers + 4 reduce_scatters of b*s*h*e*(N-1)/N each.
"""

from minidist.tp.conjugates import (copy_to_tp, gather_sequence, reduce_from_tp, reduce_scatter_sequence,
                                    scatter_sequence)
from minidist.tp.linear import ColumnParallelLinear, RowParallelLinear
from minidist.tp import cost
from minidist.tp.placement import full_tensor, sharded_parameter, sharding_of
from minidist.tp.plan import parallelize_gpt
from minidist.tp.random import RankRandom
from minidist.tp.sequence import SequenceParallelLayerNorm
from minidist.tp.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = [
    "copy_to_tp", "reduce_from_tp", "gather_sequence", "reduce_scatter_sequence", "scatter_sequence",
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "VocabParallelCrossEntropy",
    "vocab_parallel_cross_entropy", "SequenceParallelLayerNorm", "RankRandom", "sharded_parameter",
    "sharding_of", "full_tensor", "parallelize_gpt", "cost",
]
