"""Arguments that were renamed: one line naming the new ones, instead of a bare "unexpected keyword".

Every engine takes FSDP2's vocabulary: ``mesh=`` for the ranks, ``mp_policy=`` for mixed
precision, and for FSDP ``reshard_after_forward`` and explicit prefetch. An engine whose
old argument names are still in circulation (notebooks, torch's FSDP1 and DDP) accepts
them into ``**renamed`` only to refuse them here:

    FSDP(model, sharding_strategy="shard_grad_op")
    TypeError: FSDP: sharding_strategy= was renamed: use reshard_after_forward=False ...
"""

from __future__ import annotations


def refuse_renamed(who: str, given: dict, renamed: dict[str, str]) -> None:
    """Raise one TypeError naming, for every old name in `given`, what replaces it; any other
    unknown keyword is refused the way Python would (also in one line). Nothing given: returns."""
    if not given:
        return
    old = [f"{k}= was renamed: use {renamed[k]}" for k in given if k in renamed]
    unknown = [k for k in given if k not in renamed]
    if unknown:
        old.append(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
    raise TypeError(f"{who}: " + "; ".join(old))
