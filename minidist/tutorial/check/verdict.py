"""A check and its verdict: what the rung modules (ddp, zero, fsdp, tp) return, what the runner prints."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str
    """The numbers behind the verdict, measured against what was expected, on one line."""


@dataclass(frozen=True)
class Check:
    name: str
    """What must hold, in a few words (the line's head)."""
    run: Callable[[ModuleType], Verdict]
    """Runs on every rank of the world, on the learner's module; collectives in the same order everywhere."""


def within(got: float, want: float, lo: float, hi: float) -> bool:
    """lo <= got / want <= hi (want > 0)."""
    return want > 0 and lo <= got / want <= hi


def kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"
