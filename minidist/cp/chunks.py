"""Which tokens of a sequence each context-parallel rank keeps, and which chunk pairs causal attention needs.

The sequence is cut into equal chunks and each of the cp ranks keeps some of them, concatenated
in order: its local sequence. Two layouts:

    contiguous  cp chunks, rank r keeps chunk r                     s = 8 tokens, cp = 2:
                                                                    rank 0: 0 1 2 3   rank 1: 4 5 6 7
    zigzag      2 cp chunks, rank r keeps chunks r and 2cp-1-r      rank 0: 0 1 6 7   rank 1: 2 3 4 5
                (one from each end: Megatron-LM's and torch's "head-tail" load balancing)

Causal attention decides per pair of chunks (query chunk a, key chunk b) what to compute:

    b < a   FULL      every query of a sees every key of b: no mask
    b = a   DIAGONAL  the lower triangle: the usual causal mask
    b > a   NONE      every key is in the future: nothing to compute

With contiguous chunks, rank r's queries need keys of ranks 0..r only: rank 0 computes one
half block (its diagonal), rank cp-1 computes cp - 1/2 blocks, and the ring waits for the
slowest: the slowest rank does (2 - 1/cp) times the mean. With zigzag every rank's pair of
chunks (one early, one late) needs exactly 2 cp chunk pairs of the (2cp)^2 / 2 the whole causal
attention has: every rank the same work (`work` below counts it).

A diagonal pair is half a pair of work for a kernel that skips the masked tiles, as
FlashAttention's and minidist.cp.blocks' do (m (m+1) / 2 tiles of m^2, m tiles a side).

Positions: a rank's tokens keep their place in the whole sequence (`positions`), which the
GPT's learned position embedding reads, and so does the mask above.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist

from minidist import comm


class Chunking(enum.Enum):
    CONTIGUOUS = "contiguous"
    ZIGZAG = "zigzag"


class Visibility(enum.Enum):
    """What causal attention needs of a (query chunk, key chunk) pair."""

    FULL = "full"
    DIAGONAL = "diagonal"
    NONE = "none"


def n_chunks(cp: int, chunking: Chunking) -> int:
    """How many equal chunks the sequence is cut into."""
    return cp if chunking is Chunking.CONTIGUOUS else 2 * cp


def chunk_ids(cp: int, rank: int, chunking: Chunking) -> tuple[int, ...]:
    """The chunks rank `rank` of `cp` keeps, in the order its local sequence holds them."""
    return (rank,) if chunking is Chunking.CONTIGUOUS else (rank, 2 * cp - 1 - rank)


def visibility(query_chunk: int, key_chunk: int) -> Visibility:
    """The causal mask of a chunk pair (module docstring)."""
    if key_chunk < query_chunk:
        return Visibility.FULL
    return Visibility.DIAGONAL if key_chunk == query_chunk else Visibility.NONE


def work(cp: int, rank: int, chunking: Chunking, with_rank: int | None = None) -> float:
    """Chunk pairs rank `rank`'s queries need against `with_rank`'s keys (None: all ranks'), a diagonal
    pair counting 1/2. In units of one chunk pair of its layout: contiguous r + 1/2, zigzag 2 cp."""
    ranks = range(cp) if with_rank is None else (with_rank,)
    weight = {Visibility.FULL: 1.0, Visibility.DIAGONAL: 0.5, Visibility.NONE: 0.0}
    return sum(weight[visibility(a, b)] for src in ranks for a in chunk_ids(cp, rank, chunking)
               for b in chunk_ids(cp, src, chunking))


def positions(seq_len: int, cp: int, rank: int, chunking: Chunking) -> torch.Tensor:
    """The places in the whole sequence (of `seq_len` tokens) of rank `rank`'s local tokens, in local order."""
    n = n_chunks(cp, chunking)
    if seq_len % n:
        raise ValueError(f"a sequence of {seq_len} tokens does not split into {n} equal chunks ({chunking.value} "
                         f"chunking at cp={cp}); use a length that is a multiple of {n}")
    size = seq_len // n
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunk_ids(cp, rank, chunking)])


def shard_sequence(x: torch.Tensor, dim: int, cp: int, rank: int, chunking: Chunking) -> torch.Tensor:
    """Rank `rank`'s tokens of `x` (the whole sequence along `dim`), a new contiguous tensor."""
    return x.index_select(dim, positions(x.shape[dim], cp, rank, chunking).to(x.device))


def unshard_sequence(local: torch.Tensor, dim: int, group: dist.ProcessGroup, chunking: Chunking) -> torch.Tensor:
    """The whole sequence from every cp rank's `local` part (an all_gather over `group`, then each
    token back in its place). A collective over `group`."""
    cp = dist.get_world_size(group)
    moved = local.movedim(dim, 0).contiguous()
    pieces = torch.empty(cp * moved.numel(), dtype=local.dtype, device=local.device)
    comm.all_gather(pieces, moved.reshape(-1), group=group)
    pieces = pieces.view(cp, *moved.shape)
    whole = torch.empty(cp * moved.shape[0], *moved.shape[1:], dtype=local.dtype, device=local.device)
    for r in range(cp):
        whole[positions(whole.shape[0], cp, r, chunking).to(local.device)] = pieces[r]
    return whole.movedim(0, dim)
