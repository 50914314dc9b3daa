"""Group ranks and global ranks: the one place minidist converts between them.

torch.distributed names peers of point-to-point calls and roots of collectives by
global rank; an engine handed a mesh dimension (a process group) knows group ranks.
"""

from __future__ import annotations

import torch.distributed as dist

Group = dist.ProcessGroup | None


def global_rank(group: Group, group_rank: int) -> int:
    """The global rank of member `group_rank` of `group` (None = the world, where they coincide)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
