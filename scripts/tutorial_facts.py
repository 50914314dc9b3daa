"""The build-it track's snippets (docs/generated/tutorial_*.md): what in each the code decides, recomputed cheaply.

tutorial_zero: the collectives, traced bytes and optimizer state of one synchronisation + optimizer step of
each optimizer (one step of minidist.tutorial.measure's, at N = 2). tutorial_check: the checker's verdicts on
the ddp_bucketed stub (every check fails) and solution (every check passes). scripts/docs_facts.py registers
them with the others.
"""

from __future__ import annotations

from snippet_check import Fact, Snippet, cell, line, text


def tutorial_zero() -> list[Fact]:
    """Calls and traced bytes of the synchronisation + optimizer step of each optimizer (minidist.tutorial.measure)."""
    import torch
    import torch.distributed as dist

    from minidist.tutorial import measure
    sz = measure.Sizes()
    rows = measure.zero_step(sz, torch.randn(16, sz.width, generator=torch.Generator().manual_seed(dist.get_rank())))
    return [f for name, r in rows.items() for f in (
        cell(f"{name}: collectives", name, "calls", r["calls"], as_set=True),
        cell(f"{name}: traced bytes", name, "traced MB", f"{r['traced'] / measure.MB:.3f}"),
        cell(f"{name}: optimizer state", name, "state MB", f"{r['state'] / measure.MB:.3f}"))]


def tutorial_check() -> list[Fact]:
    """The checker's lines for ddp_bucketed: every check FAILs on the stub (NotImplementedError), PASSes on the
    solution; the numbers after each verdict are measured."""
    from minidist.tutorial.check.rungs import RUNGS
    checks = [c.name for c in RUNGS["ddp_bucketed"].checks]
    n = len(checks)
    return ([line(f"the stub fails {c}", f"FAIL  {c}: ", r"NotImplementedError: .*") for c in checks]
            + [line(f"the solution passes {c}", f"PASS  {c}: ", r".*") for c in checks]
            + [text("the stub's summary", f"0 of {n} checks pass"), text("the solution's summary", f"{n} of {n} checks pass")])


def tutorial() -> dict[str, Snippet]:
    return {
        "tutorial_zero": Snippet("tutorial_zero", "the collectives, traced bytes and optimizer state of every row",
                                 "measured only when generated: the kernel's bytes", tutorial_zero, world=2),
        "tutorial_check": Snippet("tutorial_check", "which checks the rung has, and that the stub fails every one "
                                  "and the solution passes every one", "every number after a verdict", tutorial_check),
    }
