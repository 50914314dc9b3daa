"""minidist.cp: context parallelism, split the sequence instead of the batch or the layers.

    from minidist.mesh import ParallelDims
    layout = ParallelDims.infer(world_size=4, cp=2).build("cpu")        # dp 2 x cp 2, "dp_cp" flattened
    model = minidist.cp.parallelize_gpt(GPT(cfg), layout["cp"], CPPolicy(Chunking.ZIGZAG, Rotate.RING))
    model = minidist.DDP(model, mesh=layout["dp_cp"])             # gradients over dp x cp
    idx, y = minidist.cp.shard_batch(idx, y, layout["cp"], Chunking.ZIGZAG)   # same rows, my tokens
    logits, loss = model(idx, y); loss.backward()

Each of the cp ranks keeps 1/cp of every sequence's tokens, so every activation (the
attention's included) is 1/cp as large; attention alone needs the other tokens' keys and
values, which travel around a ring of point-to-point messages while each rank computes on the
block it has, merged exactly by the online softmax (Liu et al. 2023, Ring Attention;
Megatron-LM's context parallelism; torch.distributed.tensor.experimental.context_parallel).

Read in this order:
  chunks.py          which tokens each rank keeps (contiguous, zigzag), their positions, and the
                     causal mask per chunk pair: full, diagonal, or nothing to compute
  online_softmax.py  attention one key block at a time: the (out, lse) merge and its backward
  blocks.py          my query chunks against one rank's key chunks, pair by pair
  ring.py            ring attention: keys and values around the ring forward, their gradients
                     home backward (an autograd Function on minidist.comm's isend/irecv)
  all_gather.py      the simple variant: all_gather k, v, reduce_scatter their gradients
  plan.py            parallelize_gpt and shard_batch: the GPT on this rank's tokens
  cost.py            the bytes by formula: 6 (cp-1)/cp b s h e per layer and step for the ring

Bytes per rank, layer and step (block = b (s/cp) h e): ring 2 (cp-1) blocks forward, 4 (cp-1)
backward; plus the gradient reduction over cp that the data-parallel engine does.
"""

from minidist.cp import cost
from minidist.cp.all_gather import all_gather_attention
from minidist.cp.chunks import (Chunking, Visibility, chunk_ids, positions, shard_sequence, unshard_sequence,
                                visibility, work)
from minidist.cp.online_softmax import attend_block, merge_
from minidist.cp.plan import CPPolicy, ContextParallelAttention, Rotate, mean_value_over, parallelize_gpt, shard_batch
from minidist.cp.ring import ring_attention

__all__ = [
    "Chunking", "Visibility", "chunk_ids", "positions", "shard_sequence", "unshard_sequence", "visibility", "work",
    "attend_block", "merge_", "ring_attention", "all_gather_attention", "CPPolicy", "Rotate",
    "ContextParallelAttention", "parallelize_gpt", "shard_batch", "mean_value_over", "cost",
]
