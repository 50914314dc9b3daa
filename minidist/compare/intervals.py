"""Time as sets of intervals: union, intersection, length. What the overlap numbers are made of.

An interval is (start, end) in seconds; a set of intervals is kept sorted and disjoint.
"""

from __future__ import annotations

from typing import Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The disjoint, sorted union; empty and reversed intervals are dropped."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def intersect(xs: list[Interval], ys: list[Interval]) -> list[Interval]:
    """Intersection of two disjoint sorted sets (as union() returns them)."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(xs: Iterable[Interval], window: Interval) -> list[Interval]:
    return intersect(union(xs), [window])


def length(xs: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(xs))
