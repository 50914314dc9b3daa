"""docs/fsdp.md's lifecycle diagram draws exactly the moves the code allows (minidist.fsdp.unit.SHARDED_TRANSITIONS).

A diagram node is named after a ShardedState (Sharded, Gathering, Unsharded, optionally with a
suffix such as Unsharded_fwd); every arrow between two nodes must be an allowed transition, and
every allowed transition must be drawn. A state added to the code, or a move, fails this test
until the diagram follows.
"""

import re
from pathlib import Path

from minidist.fsdp import ShardedState
from minidist.fsdp.unit import SHARDED_TRANSITIONS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fsdp.md"


def _diagram_moves() -> set[tuple[str, str]]:
    block = re.search(r"```mermaid\n(stateDiagram-v2.*?)```", PAGE.read_text(), re.S).group(1)
    moves = set()
    for a, b in re.findall(r"^\s*(\w+|\[\*\])\s*-->\s*(\w+|\[\*\])", block, re.M):
        if "[*]" not in (a, b):
            moves.add((a.split("_")[0].upper(), b.split("_")[0].upper()))
    return moves


def test_lifecycle_diagram_matches_the_code():
    drawn = _diagram_moves()
    allowed = {(a.name, b.name) for a, b in SHARDED_TRANSITIONS}
    assert drawn == allowed, (drawn, allowed)
    assert {s for move in drawn for s in move} == {s.name for s in ShardedState}
