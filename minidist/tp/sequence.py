"""Sequence parallelism's pieces outside the linear layers: norms, and the doors in and out of the split sequence.

Between two TP regions (a block's attention and MLP, or two blocks) every tp rank would
otherwise hold the same (b, s, h) activations and do the same work on them: layer norms,
dropout, residual adds. Under SP rank r holds tokens [r s/N, (r+1) s/N) of each sequence
instead, so those activations, and the memory the norms and dropouts keep for backward,
are divided by N. Elementwise and per-token work needs nothing else; what does:

  * a replicated parameter used there (a norm's weight and bias) sees 1/N of the tokens on
    each rank, so its gradient is a partial sum: it enters the computation through f
    (identity forward, all_reduce backward), one coalesced all_reduce of its gradients per
    norm per step (SequenceParallelLayerNorm);
  * the embeddings, computed whole on every rank, are cut to the rank's chunk
    (scatter_output: keep my chunk forward, all_gather backward);
  * a replicated output head needs the whole sequence back (gather_input: all_gather
    forward; backward keeps my chunk, the head's gradient being whole on every rank).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.hooks import RemovableHandle

from minidist.tp.conjugates import copy_to_tp, gather_sequence, scatter_sequence
from minidist.tp.placement import tp_group


class SequenceParallelLayerNorm(nn.LayerNorm):
    """nn.LayerNorm on this rank's part of the sequence; its weight and bias gradients are all_reduced over tp."""

    def __init__(self, norm: nn.LayerNorm, device_mesh: DeviceMesh):
        super().__init__(norm.normalized_shape, norm.eps, norm.elementwise_affine, bias=norm.bias is not None,
                         device=norm.weight.device if norm.weight is not None else None,
                         dtype=norm.weight.dtype if norm.weight is not None else None)
        self.weight, self.bias = norm.weight, norm.bias  # the same Parameters, replicated
        self.group = tp_group(device_mesh)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if weight is not None and bias is not None:
            weight, bias = copy_to_tp(weight, bias, group=self.group)  # one all_reduce of both gradients
        elif weight is not None:
            weight = copy_to_tp(weight, group=self.group)
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def scatter_output(module: nn.Module, device_mesh: DeviceMesh, dim: int) -> RemovableHandle:
    """From now on `module`'s output is this rank's chunk along `dim` (backward: all_gather)."""
    group = tp_group(device_mesh)[0]
    return module.register_forward_hook(lambda _m, _args, out: scatter_sequence(out, group, dim))


def gather_input(module: nn.Module, device_mesh: DeviceMesh, dim: int = 1) -> RemovableHandle:
    """From now on `module` (replicated) gets the whole sequence, all_gathered along `dim` (backward: keep my chunk)."""
    group = tp_group(device_mesh)[0]
    return module.register_forward_pre_hook(
        lambda _m, args: (gather_sequence(args[0], group, dim, grad_is_partial=False), *args[1:]))
