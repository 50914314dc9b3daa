"""The registered strategies, by name, in the order they were registered (the ladder's: what is sharded grows).

    register(Strategy(name="ddp_bf16", ...))    # from then on: strategy=ddp_bf16, a comparison row, an estimate
    get("full_shard"), names(), records()

minidist's own records register themselves when minidist.strategies is imported (single, ddp,
zero, fsdp); anything else registers its own before composing a config. Every reader (the config
groups, the composition, the comparison, the estimate) asks here each time, so a strategy
registered later is seen everywhere.
"""

from __future__ import annotations

from minidist.strategies.record import Strategy

_RECORDS: dict[str, Strategy] = {}


def register(record: Strategy) -> Strategy:
    """Add `record` (the same record again is a no-op); a different record under a taken name is refused."""
    held = _RECORDS.get(record.name)
    if held is not None and held is not record:
        raise ValueError(f"a strategy named {record.name!r} is registered already; choose another name")
    _RECORDS[record.name] = record
    return record


def unregister(name: str) -> None:
    """Remove a strategy registered by its user (a test's, say)."""
    _RECORDS.pop(name, None)


def get(name: str) -> Strategy:
    """The record of strategy `name`; ValueError (one line) naming the valid ones."""
    try:
        return _RECORDS[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(_RECORDS)}") from None


def names() -> tuple[str, ...]:
    return tuple(_RECORDS)


def records() -> tuple[Strategy, ...]:
    return tuple(_RECORDS.values())
