"""How a generated snippet is held to facts: a table cell, a line matching a pattern, a block of text.

The mechanics of scripts/docs_facts.py (which facts each snippet has): a Fact, reading one
cell of a console table by its row and column header, and checking a snippet's text.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "docs" / "generated"
if str(ROOT) not in sys.path:  # run as a script: the checkout's `recipes` must be importable
    sys.path.insert(0, str(ROOT))

STAMP = re.compile(r"(Measured|Quoted) at commit `([0-9a-f]{7,40})`")
"""How a snippet names the commit that produced it (written by scripts/gen_docs_numbers.py)."""




@dataclass(frozen=True)
class Fact:
    """One structural fact of a snippet; `kind` says how it is checked.

    cell: the table row whose leading cells read `row`, in the column headed `column`,
          reads `expect` (tokens compared as a set when `as_set`: "AG17 AR1 RS9").
    line: some line starting with `prefix` fully matches the regular expression `pattern`.
    text: `expect` appears verbatim.
    """

    kind: str
    what: str
    expect: str = ""
    row: str = ""
    column: str = ""
    as_set: bool = False
    prefix: str = ""
    pattern: str = ""


def cell(what: str, row: str, column: str, expect, as_set: bool = False) -> Fact:
    return Fact("cell", what, str(expect), row=row, column=column, as_set=as_set)


def text(what: str, expect: str) -> Fact:
    return Fact("text", what, expect)


def line(what: str, prefix: str, pattern: str) -> Fact:
    return Fact("line", what, prefix=prefix, pattern=pattern)


@dataclass(frozen=True)
class Snippet:
    job: str
    """The generator job that writes docs/generated/<name>.md."""
    structural: str
    """What in it the code decides: checked against the code in CI."""
    clock: str
    """What in it the clock decides (or the machine): not checked; '' when nothing."""
    facts: Callable[[], list[Fact]] | None = None
    world: int = 0
    """2: `facts` runs on every rank of a two-process gloo group (rank 0's list counts)."""


# --------------------------------------------------------------------------- checking


def _norm(s: str) -> str:
    return " ".join(s.split())


def read_cell(snippet: str, row: str, column: str) -> str | None:
    """The text under header `column` in the row whose leading cells read `row`, or None.

    Console tables here align each cell with its header (right- or left-justified to the same
    column): the cell is every token of the row that overlaps the header's span, widened over
    single spaces to tokens that lie under no other header word (a cell wider than its header,
    such as "AG17 AR1 RS9" under "calls/step"). Markdown tables (| a | b |) are read by their
    cells: the first row of the table is its header.
    """
    lines = snippet.splitlines()
    key = _norm(row) + " "
    for r, body in enumerate(lines):
        if body.lstrip().startswith("|"):
            got = _markdown_cell(lines, r, row, column)
            if got is not None:
                return got
            continue
        if not (_norm(body) + " ").startswith(key):
            continue
        for head in lines[r - 1::-1] if r else []:  # the nearest line above that has the header
            m = re.search(rf"(?<!\S){re.escape(column)}(?!\S)", head)
            if m:
                others = [w.span() for w in re.finditer(r"\S+", head) if w.end() <= m.start() or w.start() >= m.end()]
                return _cell_of(list(re.finditer(r"\S+", body)), m.span(), others)
    return None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _markdown_cell(lines: list[str], r: int, row: str, column: str) -> str | None:
    """Line r of a markdown table: its cell under `column` if its leading cells read `row`."""
    cells = _cells(lines[r])
    if not any(_norm(" ".join(cells[:k])) == _norm(row) for k in range(1, len(cells) + 1)):
        return None
    top = r
    while top > 0 and lines[top - 1].lstrip().startswith("|"):
        top -= 1
    header = _cells(lines[top])
    return cells[header.index(column)] if top != r and column in header and len(cells) == len(header) else None


def _cell_of(toks: list, span: tuple[int, int], others: list[tuple[int, int]]) -> str:
    inside = [k for k, t in enumerate(toks) if t.start() < span[1] and t.end() > span[0]]
    if not inside:
        return ""
    free = lambda t: not any(t.start() < b and t.end() > a for a, b in others)  # noqa: E731
    lo, hi = inside[0], inside[-1]
    while lo > 0 and toks[lo].start() - toks[lo - 1].end() == 1 and free(toks[lo - 1]):
        lo -= 1
    while hi + 1 < len(toks) and toks[hi + 1].start() - toks[hi].end() == 1 and free(toks[hi + 1]):
        hi += 1
    return " ".join(t.group() for t in toks[lo:hi + 1])


def check(snippet: str, facts: list[Fact]) -> list[str]:
    """Every fact the snippet contradicts, as one line each ([] when it agrees with the code)."""
    bad = []
    for f in facts:
        if f.kind == "cell":
            got = read_cell(snippet, f.row, f.column)
            same = (got is not None and (set(got.split()) == set(f.expect.split()) if f.as_set
                                         else _norm(got) == _norm(f.expect)))
            if not same:
                bad.append(f"{f.what}: row {f.row!r}, column {f.column!r} reads {got!r}; the code gives {f.expect!r}")
        elif f.kind == "line":
            hits = [s for s in snippet.splitlines() if s.startswith(f.prefix)]
            if not any(re.fullmatch(f.pattern, s[len(f.prefix):]) for s in hits):
                bad.append(f"{f.what}: no line {f.prefix!r}... has the code's wording; the snippet has "
                           f"{[s[:120] for s in hits] or 'none'}")
        elif f.expect not in snippet:
            bad.append(f"{f.what}: the snippet does not contain the code's text:\n{textwrap.indent(f.expect, '    ')}")
    return bad


def to_json(facts: dict[str, list[Fact]]) -> dict:
    return {name: [asdict(f) for f in fs] for name, fs in facts.items()}


def from_json(data: dict) -> dict[str, list[Fact]]:
    return {name: [Fact(**f) for f in fs] for name, fs in data.items()}
