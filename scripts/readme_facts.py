"""README.md's measured numbers, taken from the generated snippets they summarise, never typed by hand.

A number in README.md that a generated snippet (docs/generated/*.md) holds is written between
markers, invisible on GitHub:

    | alpha, beta (...) | <!-- fact:tour_alpha_beta -->alpha 149.9 +- 3.1 us, ...<!-- /fact --> |

FACTS says which snippet each comes from and how it is read there. scripts/gen_docs_numbers.py
rewrites the marked values after every job (and with --readme alone); tests/docs/test_drift.py
fails when a marked value differs from its snippet, when a marker names no fact, or when a fact
has no marker: the README cannot drift from the measurements it quotes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from snippet_check import GENERATED, ROOT

README = ROOT / "README.md"
MARKER = re.compile(r"<!-- fact:(\w+) -->(.*?)<!-- /fact -->")


def _search(pattern: str, text: str) -> re.Match:
    m = re.search(pattern, text)
    if m is None:
        raise ValueError(f"pattern {pattern!r} not found")
    return m


def _fsdp_x_tp(text: str) -> str:
    return _search(r"writes ([\d.]+)x full_shard's bytes", text).group(1) + "x"


def _tour_alpha_beta(text: str) -> str:
    m = _search(r"alpha = ([\d.]+ \+- [\d.]+) us, beta = ([\d.]+ \+- [\d.]+) ns/byte \(([\d.]+) GB/s\)", text)
    return f"alpha {m.group(1)} us, beta {m.group(2)} ns/byte ({m.group(3)} GB/s)"


def _compare_alpha_beta(text: str) -> str:
    m = _search(r"calibrated alpha ([\d.]+(?: \+- [\d.]+)?) us, beta ([\d.]+(?: \+- [\d.]+)?) ns/B", text)
    return f"alpha {m.group(1)} us, beta {m.group(2)} ns/byte"


def _ddp_rows(text: str) -> list[list[str]]:
    """bench_ddp's table rows: sleep, bucket, buckets, minidist, torch, ratio, ..., hidden md/torch, ..."""
    return [line.split() for line in text.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+/\d+\s", line)]


def _ddp_ratio(text: str) -> str:
    ratios = [float(r[5]) for r in _ddp_rows(text)]
    median = _search(r"median over all rows: ([\d.]+)", text).group(1)
    return f"{min(ratios):.2f}-{max(ratios):.2f} (median of rows {median})"


def _ddp_hidden(text: str) -> str:
    rows = [r for r in _ddp_rows(text) if float(r[0]) > 0]
    mine, theirs = zip(*(r[9].split("/") for r in rows))
    buckets = " / ".join(r[1] for r in rows)
    return (f"{buckets} MB buckets: minidist {' / '.join(m.rstrip('%') for m in mine)}%, "
            f"torch {' / '.join(t.rstrip('%') for t in theirs)}%")


def _zero_overlap(text: str) -> str:
    off = _search(r"overlap_param_gather=False:\s+([\d.]+) ms", text).group(1)
    on, faster = _search(r"overlap_param_gather=True:\s+([\d.]+) ms\s+\(([\d.]+x) faster\)", text).groups()
    return f"{faster} faster ({float(on):.0f} vs {float(off):.0f} ms)"


def _zero_bytes(text: str) -> str:
    m = _search(r"sends ([\d.]+)x DDP's bytes per step and the owner-broadcast variant ([\d.]+)x \(mean over the "
                r"(\d+) ranks; its busiest rank ([\d.]+)x\)", text)
    return f"{m.group(1)} / {m.group(1)} / {m.group(2)} (mean over ranks; its busiest rank {m.group(4)} at N = {m.group(3)})"


def _fsdp_speed(text: str) -> str:
    fsdp2 = _search(r"step-time ratio FSDP/FSDP2: ([\d.]+)", text).group(1)
    ddp = _search(r"step-time ratio FSDP/DDP: ([\d.]+)", text).group(1)
    return f"{fsdp2} (FSDP / DDP: {ddp})"


def _fsdp_hidden(text: str) -> str:
    def row(engine: str) -> tuple[str, str]:
        m = _search(r"(?m)^  " + re.escape(engine) + r"\s+[\d.]+\s+[-\d.]+\s+(-?[\d.]+)%\s+([\d.]+)%", text)
        return m.group(1), m.group(2)
    (mine, limit), (theirs, _) = row("fsdp"), row("fsdp2")
    return f"minidist {mine}% (limit {limit}%), torch {theirs}%"


def _trace_overhead(text: str) -> str:
    def us(label: str) -> float:
        return float(_search(re.escape(label) + r"\s+[\d.]+ us/call\s+\+([\d.]+) us vs torch", text).group(1))
    return (f"+{us('minidist.comm.all_reduce '):.0f} / +{us('minidist.comm.all_reduce, traced '):.0f} us; async "
            f"+{us('minidist.comm.all_reduce, async '):.0f} / +{us('minidist.comm.all_reduce, async, traced '):.0f} us")


def _persistent(text: str) -> str:
    m = _search(r"persistent ([\d.]+) MiB/rank vs ZeRO-3 16 psi/N ([\d.]+) MiB \(ratio ([\d.]+)\)", text)
    return f"{m.group(1)} MiB (ratio {m.group(3)})"


def _main_job(text: str) -> str:
    """The last run of the main job's settings in the sweep's table (its row in bold): ratio, bits, wall."""
    rows = [line for line in text.splitlines() if "(the main job)" in line]
    if not rows:
        raise ValueError("no row of the main job's settings")
    cells = [c.strip().strip("*") for c in rows[-1].strip("|").split("|")]
    bpb, ratio = cells[7].split(" / ")[1], cells[8].split(" / ")[1]
    return f"ratio {ratio} ({bpb} bits per byte) in {cells[4]} s of wall time at load {cells[6]}"


FACTS: dict[str, tuple[str, Callable[[str], str]]] = {
    "main_job": ("main_job_sweep", _main_job),
    "fsdp_x_tp": ("lesson_fsdp_x_tp_n4", _fsdp_x_tp),
    "tour_alpha_beta": ("tour_cost", _tour_alpha_beta),
    "compare_alpha_beta": ("compare", _compare_alpha_beta),
    "ddp_ratio": ("bench_ddp", _ddp_ratio),
    "ddp_hidden": ("bench_ddp", _ddp_hidden),
    "zero_overlap": ("bench_zero_overlap", _zero_overlap),
    "zero_bytes": ("lesson_zero1_vs_ddp_n4", _zero_bytes),
    "fsdp_speed": ("bench_fsdp_speed", _fsdp_speed),
    "fsdp_hidden": ("bench_fsdp_overlap", _fsdp_hidden),
    "trace_overhead": ("trace_overhead", _trace_overhead),
    "persistent_n1": ("bench_fsdp_memory_1", _persistent),
    "persistent_n2": ("bench_fsdp_memory_2", _persistent),
}
"""README fact -> (the snippet it is read from, how)."""


def expected(generated: Path = GENERATED) -> dict[str, str]:
    """Every fact's value as its snippet says it now."""
    out = {}
    for name, (snippet, read) in FACTS.items():
        try:
            out[name] = read((generated / f"{snippet}.md").read_text())
        except ValueError as exc:
            raise ValueError(f"README fact {name}: snippet {snippet}: {exc}") from None
    return out


def check(readme: str, generated: Path = GENERATED) -> list[str]:
    """What is wrong with the README's marked numbers (nothing: [])."""
    found = MARKER.findall(readme)
    want = expected(generated)
    problems = [f"README marks unknown fact {name!r} (scripts/readme_facts.py FACTS)" for name, _ in found
                if name not in FACTS]
    problems += [f"README fact {name} is not marked in README.md" for name in FACTS if name not in dict(found)]
    problems += [f"README fact {name} says {value!r}, its snippet {FACTS[name][0]} says {want[name]!r}: run "
                 f"`.venv/bin/python scripts/gen_docs_numbers.py --readme`"
                 for name, value in found if name in want and value != want[name]]
    return problems


def rewrite(readme: str, generated: Path = GENERATED) -> str:
    """The README with every marked value replaced by its snippet's."""
    want = expected(generated)
    return MARKER.sub(lambda m: f"<!-- fact:{m.group(1)} -->{want.get(m.group(1), m.group(2))}<!-- /fact -->", readme)
