"""Collective fingerprints: the ranks agree on each collective before it runs (a debug switch).

Why: ranks that disagree on a collective do not fail cleanly. Different sizes
make gloo abort the process ("Received data size doesn't match expected
size", SIGABRT); a different op or order can hang until the timeout, or
match up wrongly and corrupt memory silently. PyTorch's answer is
TORCH_DISTRIBUTED_DEBUG=DETAIL; this is minidist's, for every collective
issued through minidist.comm.

    MINIDIST_DEBUG_COLLECTIVES=1 torchrun ...       # or comm.set_debug(True)

Before each collective, each rank hashes its fingerprint (op, shape, dtype,
logical element count, the group's name and global ranks, and the
collective's sequence number on that group) to 63 bits, and the group all_gathers the
hashes with a plain torch.distributed call (neither traced nor recorded, so it
does not shift the sequence numbers). Equal hashes: the collective runs. Any
difference: the group all_gathers each rank's description and call site (the
first frame outside minidist.comm) and every rank raises the same
CollectiveMismatchError, naming what each rank issued, where, and which ranks
differ from the group's first rank.

Not compared: the reduce op, the root of broadcast/reduce/gather/scatter
(_issue does not see them), and the shapes of all_to_all, whose list form may
legitimately send uneven pieces (its op, dtype, group and number still are).

Cost: one extra blocking all_gather of one int64 per collective, i.e. one
more small-message latency (alpha) of the group, plus hashing a short string;
an async collective is checked before it is issued, so the check itself
overlaps with nothing. Measured by benchmarks/fingerprint_overhead.py (world
2, gloo, all_reduce through minidist.comm, check off/on alternating, on a
2-core machine shared with a load average of 9-18, four runs): +0.6 to
+1.5 ms per collective in the fastest rounds (medians +0.8 to +4.4 ms), where
a 1 KB all_reduce itself took 0.4-0.8 ms: roughly 2-4x for small collectives,
+20-270% for 1 MB ones, noise included. On an idle machine expect about one alpha (~150-200 us here by
`make tour`). A debugging switch, off by default.
"""

from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist

from minidist.comm.collective_log import format_site


# As in collectives.py (which imports this module): torch 2.14's name, else the older one.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def enabled_by_env(environ=os.environ) -> bool:
    """MINIDIST_DEBUG_COLLECTIVES set to anything but '' or '0'."""
    return environ.get("MINIDIST_DEBUG_COLLECTIVES", "") not in ("", "0")


ENABLED = enabled_by_env()


class CollectiveMismatchError(RuntimeError):
    """The ranks of a group were about to issue different collectives."""


def set_debug(on: bool) -> None:
    """Check every collective's fingerprint across its group before it runs (MINIDIST_DEBUG_COLLECTIVES=1).

    Every rank must set the same value before its next collective: the check is itself one small
    all_gather per collective, which a rank without it would not join."""
    global ENABLED
    ENABLED = bool(on)


def describe(op: str, tensor: torch.Tensor | None, numel: int, group_name: str, ranks: tuple[int, ...], seq: int) -> str:
    """What the ranks must agree on, as text: 'all_reduce #3 float32[4, 256] numel=1024 on group world (0, 1)'."""
    if tensor is None:
        what = ""
    elif op == "all_to_all":  # list form: pieces may be uneven across ranks
        what = f" {str(tensor.dtype).removeprefix('torch.')}"
    else:
        what = f" {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} numel={numel}"
    return f"{op} #{seq}{what} on group {group_name} {ranks}"


def _device(tensor: torch.Tensor | None, group) -> torch.device:
    if tensor is not None and tensor.device.type != "cpu":
        return tensor.device
    if "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check(op: str, tensor: torch.Tensor | None, numel: int, group, entry) -> None:
    """Raise CollectiveMismatchError on every rank of `group` unless all of them issue the same collective.

    `entry` is the flight recorder's record of this call: its group, sequence number and call site.
    """
    world = dist.get_world_size(group)
    if world <= 1:  # alone, or not a member (-1): nothing to agree with
        return
    ranks = entry.group.ranks
    desc = describe(op, tensor, numel, entry.group.name, ranks, entry.seq)
    digest = int.from_bytes(hashlib.blake2b(desc.encode(), digest_size=8).digest(), "little") >> 1
    dev = _device(tensor, group)
    hashes = torch.empty(world, dtype=torch.int64, device=dev)
    _all_gather_single(hashes, torch.tensor([digest], dtype=torch.int64, device=dev), group=group)
    hashes = hashes.tolist()
    if all(h == hashes[0] for h in hashes):
        return
    seen: list = [None] * world
    dist.all_gather_object(seen, (desc, format_site(entry.site)), group=group)
    raise CollectiveMismatchError(mismatch_message(seen, hashes, ranks))


def mismatch_message(seen: list[tuple[str, str]], hashes: list[int], ranks: tuple[int, ...]) -> str:
    """One line: what each rank issued and where, and which ranks differ from the group's first."""
    parts = [f"rank {ranks[i]} issues {desc} at {site}" for i, (desc, site) in enumerate(seen)]
    differ = [ranks[i] for i, h in enumerate(hashes) if h != hashes[0]]
    return (f"ranks issue different collectives: {'; '.join(parts)}. Ranks {differ} differ from rank {ranks[0]}. "
            f"Every rank of a group must issue the same collectives, in the same order, with the same shapes")
