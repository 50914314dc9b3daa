"""Context parallelism for minidist.models.GPT: the attention, the positions and the loss, applied in place.

    cp_mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))      # or layout["cp"] of a larger mesh
    model = parallelize_gpt(GPT(cfg), cp_mesh, CPPolicy(chunking=Chunking.ZIGZAG))
    idx, targets = shard_batch(idx, targets, cp_mesh, Chunking.ZIGZAG)   # my tokens of the same rows
    logits, loss = model(idx, targets)     # logits of my tokens; loss: the mean over all cp ranks' tokens

Every cp rank reads the same batch rows and keeps its chunks of each sequence (minidist.cp.chunks).
Everything in the GPT but attention works token by token, so it runs unchanged on the local
tokens; three things are swapped or hooked, none with parameters (state_dict keys unchanged):

  * each block's CausalAttention becomes ContextParallelAttention: its q, k, v are the local
    tokens', the keys and values of the others come round the ring (minidist.cp.ring) or by
    all_gather (minidist.cp.all_gather);
  * the position embedding (wpe), called with 0..t-1 for t local tokens, is handed the tokens'
    places in the whole sequence instead (a forward pre-hook);
  * the loss (the criterion module): its value becomes the mean over all cp ranks' tokens (one
    all_reduce of a scalar), while its gradient stays that of the local mean.

Why the gradient stays local: cp ranks hold the same weights but saw different tokens, so
their gradients must be reduced over cp as over data parallelism. The data-parallel engine
does it when it spans dp x cp (layout["dp_cp"], torchtitan's dp_shard_cp): DDP or FSDP average
over dp * cp ranks, and the mean of the local means (equal token counts) is the gradient of
the mean over every token. Without a data-parallel engine, all_reduce the gradients over cp.

Order with tensor parallelism (torchtitan's): minidist.tp.parallelize_gpt first (it replaces
the criterion under vocab_parallel and hooks wpe under sequence_parallel), then this, then the
data-parallel engine over "dp_cp". Dropout is refused: the attention's would need a mask per
(query, key) pair drawn alike wherever the pair is computed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.cp.all_gather import all_gather_attention
from minidist.cp.chunks import Chunking, n_chunks, positions, shard_sequence
from minidist.cp.ring import ring_attention
from minidist.mesh import CP
from minidist.models.gpt import GPT, CausalAttention


class Rotate(enum.Enum):
    """How the keys and values reach every rank (torch's set_rotate_method names them alike)."""

    RING = "ring"
    ALL_GATHER = "all_gather"


@dataclass(frozen=True)
class CPPolicy:
    """How the sequence is split and how keys and values travel."""

    chunking: Chunking = Chunking.ZIGZAG
    rotate: Rotate = Rotate.RING

    @classmethod
    def of(cls, chunking: str = "zigzag", rotate: str = "ring", prefix: str = "") -> CPPolicy:
        """From the names a config spells (one line naming the valid ones otherwise)."""
        for value, kind, key in ((chunking, Chunking, "chunking"), (rotate, Rotate, "rotate")):
            if value not in {m.value for m in kind}:
                raise ValueError(f"{prefix}{key}={value!r} is not one of {', '.join(m.value for m in kind)}")
        return cls(Chunking(chunking), Rotate(rotate))


def cp_group(device_mesh: DeviceMesh) -> dist.ProcessGroup:
    """The process group of a 1-D "cp" mesh; one line if it is not one."""
    names = device_mesh.mesh_dim_names
    if device_mesh.ndim != 1 or (names is not None and names != (CP,)):
        raise ValueError(f"context parallelism spans one mesh dimension named {CP!r}, got dimensions {names}; "
                         f"pass mesh[{CP!r}]")
    return device_mesh.get_group()


class ContextParallelAttention(nn.Module):
    """Drop-in for minidist.models.gpt.CausalAttention: causal attention of the local tokens over the whole sequence."""

    def __init__(self, device_mesh: DeviceMesh, policy: CPPolicy):
        super().__init__()
        self.group, self.policy = cp_group(device_mesh), policy
        self._attend = ring_attention if policy.rotate is Rotate.RING else all_gather_attention

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._attend(q, k, v, self.group, self.policy.chunking)


def check_degree(cfg, cp: int, chunking: Chunking, setting: str = "cp", prefix: str = "") -> None:
    """One line where `cp` ranks cannot split a GPT of config `cfg`: dropout, or a block_size that
    does not cut into the layout's chunks."""
    if cfg.dropout > 0:
        raise ValueError(f"{setting}={cp}: context parallelism runs without dropout (the attention's mask would "
                         f"have to be drawn alike on every rank a chunk pair visits); set {prefix}dropout=0")
    if cfg.block_size % n_chunks(cp, chunking):
        valid = [d for d in range(1, cfg.block_size + 1) if cfg.block_size % n_chunks(d, chunking) == 0]
        raise ValueError(f"{setting}={cp} must split {prefix}block_size={cfg.block_size} into "
                         f"{n_chunks(cp, chunking)} chunks ({chunking.value}); valid: {', '.join(map(str, valid[:8]))}")


def parallelize_gpt(model: GPT, device_mesh: DeviceMesh, policy: CPPolicy | None = None) -> GPT:
    """Make `model` compute on this rank's tokens over the 1-D "cp" mesh, in place; returns `model`."""
    policy = policy or CPPolicy()
    group = cp_group(device_mesh)
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    check_degree(model.cfg, cp, policy.chunking)
    if any(isinstance(m, ContextParallelAttention) for m in model.modules()):
        raise ValueError("parallelize_gpt: this model is already context-parallel; apply it once")
    for block in model.blocks:
        if not isinstance(block.attn.attend, CausalAttention):
            raise ValueError(f"context parallelism replaces CausalAttention, found {type(block.attn.attend).__name__}")
        block.attn.attend = ContextParallelAttention(device_mesh, policy)
    block_size = model.cfg.block_size

    def global_positions(_module, args):
        local = args[0]
        whole = local.numel() * cp
        if whole > block_size:
            raise ValueError(f"a sequence of {whole} tokens ({local.numel()} per rank x cp={cp}) exceeds "
                             f"block_size={block_size}")
        return (positions(whole, cp, rank, policy.chunking).to(local.device)[local],)

    model.wpe.register_forward_pre_hook(global_positions)
    def token_mean(module, args, loss):
        scored = (args[1] != getattr(module, "ignore_index", -100)).sum()
        return mean_value_over(loss, group, scored)

    model.criterion.register_forward_hook(token_mean)
    return model


def mean_value_over(loss: torch.Tensor, group: dist.ProcessGroup, scored: torch.Tensor | None = None) -> torch.Tensor:
    """`loss`, this rank's mean over its `scored` targets, as the mean over every scored target of `group`.

    Its value is sum_r n_r loss_r / sum_r n_r; its gradient is this rank's own scaled by cp n_r / sum_r n_r,
    so that the data-parallel engine's average over the group (a division by cp) leaves the gradient of the
    whole mean. With every rank scoring as many targets (no ignored ones) the scale is 1 and the value the
    plain mean. `scored` None: equal counts."""
    cp = dist.get_world_size(group)
    n = torch.ones((), dtype=torch.float64, device=loss.device) if scored is None else \
        scored.detach().to(loss.device, torch.float64)
    both = torch.stack([loss.detach().double() * n, n])
    comm.all_reduce(both, group=group)
    total = both[1].clamp(min=1)
    mean = (both[0] / total).to(loss.dtype)
    weighted = loss * (cp * n / total).to(loss.device, loss.dtype)
    return weighted + (mean - weighted.detach())


def shard_batch(idx: torch.Tensor, targets: torch.Tensor | None, device_mesh: DeviceMesh,
                chunking: Chunking = Chunking.ZIGZAG) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's tokens of (batch, time) inputs and targets: the same rows on every cp rank, its chunks of each."""
    group = cp_group(device_mesh)
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    cut = [shard_sequence(t, 1, cp, rank, chunking) if t is not None else None for t in (idx, targets)]
    return cut[0], cut[1]
