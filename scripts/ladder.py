"""The strategies' ladder as the docs show it (docs/generated/strategies.md), from their records.

One row per registered strategy, in the registry's order (what is sharded grows): its name,
what it shards and which engine runs it (the record's summary and engine), the bytes one rank
sends per step (its closed_form) and ZeRO's model states per rank (its states_formula). Written by
`scripts/gen_docs_numbers.py strategies`, held to the records by tests/docs/test_drift.py.
"""

from __future__ import annotations


def table() -> str:
    from minidist import strategies
    rows = ["| `strategy=` | what it shards | engine | sent per step and rank | model states per rank |",
            "|---|---|---|---|---|"]
    rows += [f"| `{r.name}` | {r.summary} | {r.engine} | `{r.closed_form}` | `{r.states_formula}` |"
             for r in strategies.records()]
    return "\n".join(rows) + "\n"
