"""The lessons' snippets (docs/generated/lesson_*.md): what in each the code decides, recomputed cheaply.

Every lesson's claim wording comes from the lesson's own template (recipes/lessons/common.claim_pattern);
four lessons also have table cells the code decides without the clock (traced bytes, no_sync's
reductions, TP's and DDP's formulas, SP's formulas with the vocabulary whole and split). scripts/docs_facts.py registers them with the others.
"""

from __future__ import annotations

from typing import Callable

from snippet_check import Fact, Snippet, cell, line


def lesson_claim(name: str) -> Fact:
    from recipes.lessons.common import claim_pattern
    return line(f"lesson {name}: the claim's wording", "claim: ",
                claim_pattern(name) + r" -> (holds|timing not seen on this small run.*)")


def lesson(name: str, cells: Callable[[], list[Fact]] | None = None) -> Callable[[], list[Fact]]:
    return lambda: [lesson_claim(name)] + (cells() if cells else [])


def lesson_claims() -> list[Fact]:
    from recipes.lessons import LESSONS
    from recipes.lessons.common import claim_pattern
    return [line(f"lesson {n}: the claim's wording in the list", f"{i + 1}. `{n}`: ",
                 claim_pattern(n) + r" -> (holds|timing not seen on this small run.*)")
            for i, n in enumerate(LESSONS)]


def _lesson_context():
    import torch
    import torch.distributed as dist

    from minidist.runtime import Topology
    from recipes.lessons.common import Context
    return Context(Topology(dist.get_rank(), dist.get_world_size(), dist.get_rank(), "gloo", torch.device("cpu"),
                            dist.group.WORLD), small=False)


def fsdp_vs_ddp_bytes_cells() -> list[Fact]:
    """Traced bytes per phase and call type of every engine, in units of S (N-1)/N."""
    from recipes.lessons import fsdp_vs_ddp_bytes as les
    _, unit, res = les.units(_lesson_context(), small=False)
    return [cell(f"{e}: {col}", e, col, f"{r['trace'][key] / unit:.3g}")
            for e, r in res.items() for col, key in les.COLUMNS.items()]


def no_sync_cells() -> list[Fact]:
    """How many micro-batches each engine reduces under each form of no_sync."""
    from recipes.lessons import no_sync as les
    k = 4
    return [cell(f"{e}, no_sync around {form}", f"{e} {form}", "reduced",
                 f"{k if v == 'K' else v} of {k}")
            for e in les.ENGINES for form, v in les.EXPECTED[e.split()[-1]].items()]


def tp_vs_ddp_bytes_cells() -> list[Fact]:
    """TP's and DDP's bytes by formula at every batch size (the lessons job runs at N = 2)."""
    from minidist.models.gpt import GPT
    from minidist.tp import cost
    from recipes.lessons import tp_vs_ddp_bytes as les
    cfg, n = les.config(small=False), 2
    ddp = 2 * sum(p.numel() for p in GPT(cfg).parameters()) * 4 * (n - 1) / n
    return [c for b in les.batch_sizes(small=False) for c in (
        cell(f"TP's formula at b = {b}", str(b), "TP formula", f"{cost.step_bytes(cfg, b, cfg.block_size, n) / 2**10:.3g}"),
        cell(f"DDP's formula at b = {b}", str(b), "DDP formula", f"{ddp / 2**10:.3g}"))]


def sequence_parallel_cells() -> list[Fact]:
    """minidist.tp.cost's bytes for each plan (the lessons job runs at N = 2, full size: b = 32)."""
    from minidist.tp import cost
    from recipes.lessons import sequence_parallel as les
    cfg = les.config(small=False)
    return [cell(f"{name}: formula", name, "formula KiB",
                 f"{cost.step_bytes(cfg, 32, cfg.block_size, 2, sequence_parallel=sp, vocab_parallel=v) / 2**10:.3g}")
            for name, (sp, v) in les.PLANS.items()]


def pp_bubble_cells() -> list[Fact]:
    """The formula column of the bubble table (the lessons job runs at N = 2, m = 2N)."""
    from minidist.pp import cost
    p, m = 2, 4
    rows = (("1f1b", 1, 1), ("gpipe", 1, m), ("1f1b", 1, m), ("interleaved_1f1b", 2, m))
    return [cell(f"{n} at m = {mb}: the formula", f"{n} {v} {mb}", "formula", f"{cost.bubble(n, p, mb, v):.3g}")
            for n, v, mb in rows]


def cp_vs_tp_bytes_cells() -> list[Fact]:
    """DDP's, CP's and TP's bytes by formula at every sequence length (the lessons job runs at N = 2)."""
    from minidist import cp
    from minidist.models.gpt import GPT
    from minidist.tp import cost as tp_cost
    from recipes.lessons import cp_vs_tp_bytes as les
    cfg, n = les.config(small=False), 2
    ddp = 2 * sum(p.numel() for p in GPT(cfg).parameters()) * 4 * (n - 1) / n
    return [cell(f"{what}'s formula at s = {s}", str(s), col, f"{value / 2**10:.3g}")
            for s in les.lengths(small=False)
            for what, col, value in (("DDP", "DDP formula", ddp),
                                     ("CP", "CP formula", ddp + cp.cost.step_bytes(cfg, 1, s, n)),
                                     ("TP", "TP formula", tp_cost.step_bytes(cfg, 1, s, n)))]


def zigzag_balance_cells() -> list[Fact]:
    """The tiles each rank computes under each layout (the lessons job runs at N = 2)."""
    from minidist.cp import Chunking
    from recipes.lessons import zigzag_balance as les
    s = les.sizes(small=False)[0]
    return [cell(f"rank {r}'s {c.value} tiles", str(r), f"{c.value} tiles", str(les.tiles(s, 2, r, c)))
            for r in range(2) for c in Chunking]


_LESSON_CLOCK = {
    "bucket_sweep": "alpha, beta, T and everything computed from them (b*, the caps, the buckets, the formula and "
                    "measured ms, the claim's ms)",
    "rs_ag_is_all_reduce": "",
    "fsdp_vs_ddp_bytes": "",
    "fsdp_memory": "",
    "prefetch": "the forward and backward ms and the speed-up in the claim",
    "no_sync": "",
    "zero1_vs_ddp": "the ms columns and the step-time ratio in the claim",
    "gloo_reduce_scatter": "the time columns and the time ratios in the claim",
    "tp_vs_ddp_bytes": "",
    "sequence_parallel": "",
    "fsdp_x_tp": "",
    "pp_bubble": "the step times and the measured bubbles",
    "pp_memory": "",
    "pp_vs_dp_tp_bytes": "",
    "cp_vs_tp_bytes": "",
    "cp_memory": "",
    "zigzag_balance": "the ms columns and the busy-time ratios in the claim",
}
_LESSON_CELLS = {"fsdp_vs_ddp_bytes": fsdp_vs_ddp_bytes_cells,
                 "no_sync": no_sync_cells, "tp_vs_ddp_bytes": tp_vs_ddp_bytes_cells,
                 "sequence_parallel": sequence_parallel_cells, "pp_bubble": pp_bubble_cells,
                 "cp_vs_tp_bytes": cp_vs_tp_bytes_cells, "zigzag_balance": zigzag_balance_cells}
_LESSON_STRUCTURE = {
    "fsdp_vs_ddp_bytes": "the claim's wording; the traced bytes of every engine, phase and call type",
    "no_sync": "the claim's wording; how many micro-batches each engine reduces under each form",
    "tp_vs_ddp_bytes": "the claim's wording; TP's and DDP's bytes by formula at every batch size",
    "sequence_parallel": "the claim's wording; each plan's bytes by formula",
    "pp_bubble": "the claim's wording; every schedule's bubble by formula",
    "cp_vs_tp_bytes": "the claim's wording; DDP's, CP's and TP's bytes by formula at every sequence length",
    "zigzag_balance": "the claim's wording; the tiles each rank computes under each layout",
}
LESSON_MEASURED = {
    "bucket_sweep": "layers left",
    "rs_ag_is_all_reduce": "the kernel's byte counts",
    "fsdp_vs_ddp_bytes": "the kernel's byte counts",
    "fsdp_memory": "what each engine keeps between steps and the peaks (torch's MemTracker)",
    "prefetch": "gathers ahead and the units gathered at once (torch's profiler) and the peak (MemTracker)",
    "no_sync": "the kernel's byte counts and the errors",
    "zero1_vs_ddp": "the optimizer state on the largest rank",
    "gloo_reduce_scatter": "the kernel's byte counts",
    "tp_vs_ddp_bytes": "the kernel's byte counts and the crossing",
    "sequence_parallel": "the kernel's byte counts, and the norms' and dropouts' activations (MemTracker)",
    "fsdp_x_tp": "the kernel's byte counts, the formulas (FSDP's padded units), parameters and peaks (MemTracker)",
    "pp_bubble": "the simulated lists against the formulas",
    "pp_memory": "the activations held (MemTracker) and the action lists' counts",
    "pp_vs_dp_tp_bytes": "the kernel's byte counts and the formulas",
    "cp_vs_tp_bytes": "the kernel's byte counts and the crossing",
    "cp_memory": "the kept activations and the peaks (MemTracker)",
    "zigzag_balance": "nothing else",
}
"""Decided by the code but measured at full size only when the snippet is generated (checked, at small
size and at N = 2 and 4, by the lesson's own claim in tests/recipes/test_lessons.py)."""


def lessons() -> dict[str, Snippet]:
    from recipes.lessons import LESSONS
    out = {}
    for n in LESSONS:
        clock = _LESSON_CLOCK.get(n, "the times")
        out[f"lesson_{n}"] = Snippet(
            "lessons", _LESSON_STRUCTURE.get(n, "the claim's wording"),
            f"{clock + '; ' if clock else ''}measured at this size only when generated: "
            f"{LESSON_MEASURED.get(n, 'the rest')}",
            lesson(n, _LESSON_CELLS.get(n)), world=2 if n == "fsdp_vs_ddp_bytes" else 0)
    return out
