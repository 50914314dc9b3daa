"""Every rank built the same model: checked once, when an engine wraps it.

Why: an engine that starts from different models on different ranks does not
fail where the mistake is. DDP would broadcast into the wrong shapes; FSDP
and ZeRO shard flat buffers whose sizes then differ, and gloo aborts the
process ("Received data size doesn't match expected size", SIGABRT) or a
collective hangs until the timeout. Checking at construction turns that into
one error, on every rank, naming the first parameter or buffer that differs.

    verify_same_model(module.named_parameters(), module.named_buffers(), group, "FSDP")

Cost: two all_gathers of int64 at construction (the entry counts, then one
63-bit hash per entry, padded to the longest list): 8 bytes per parameter
and buffer per rank, once.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch
import torch.distributed as dist

from minidist import comm


def _describe(name: str, t: torch.Tensor, kind: str) -> str:
    grad = f", requires_grad={t.requires_grad}" if kind == "parameter" else ""
    return f"{kind} '{name}' shape={tuple(t.shape)} dtype={str(t.dtype).removeprefix('torch.')}{grad}"


def verify_same_model(named_params: Iterable[tuple[str, torch.Tensor]], named_buffers: Iterable[tuple[str, torch.Tensor]],
                      group: dist.ProcessGroup | None, engine_name: str) -> None:
    """Raise on every rank of `group` if any rank built a different model, naming the first difference.

    Compares (name, shape, dtype, requires_grad) of every parameter and
    (name, shape, dtype) of every buffer, in order. Every rank sees the same
    table of hashes and so reaches the same verdict: no rank is left waiting
    in a collective that the others skipped.
    """
    params, buffers = list(named_params), list(named_buffers)
    entries = [_describe(n, p, "parameter") for n, p in params] + [_describe(n, b, "buffer") for n, b in buffers]
    world = dist.get_world_size(group)
    if world == 1:
        return
    dev = params[0][1].device if params else torch.device("cpu")  # NCCL only moves device tensors
    counts = torch.zeros(world, dtype=torch.int64, device=dev)
    comm.all_gather(counts, torch.tensor([len(entries)], dtype=torch.int64, device=dev), group=group)
    width = int(counts.max())
    hashes = [int.from_bytes(hashlib.blake2b(e.encode(), digest_size=8).digest(), "little") >> 1 for e in entries]
    mine = torch.tensor(hashes + [-1] * (width - len(hashes)), dtype=torch.int64)
    table = torch.zeros(world * width, dtype=torch.int64, device=dev)
    comm.all_gather(table, mine.to(dev), group=group)
    table = table.view(world, width).cpu()
    differs = (table != table[0]).any(dim=0).nonzero()
    if differs.numel():
        k = int(differs[0])
        here = entries[k] if k < len(entries) else "nothing (this rank has fewer parameters/buffers)"
        agree = [comm.global_rank(group, r) for r in range(world) if int(table[r, k]) == int(mine[k])]
        raise RuntimeError(
            f"{engine_name}: ranks built different models. Entry #{k} differs across ranks; this rank has {here}; "
            f"ranks {agree} (of {world}) agree with this rank. Every rank must construct the same module "
            f"(same parameter names, shapes and dtypes, in the same order) before wrapping it in {engine_name}.")
