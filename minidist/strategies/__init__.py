"""Every parallelism strategy as one record, and the registry the rest of minidist derives from.

    from minidist import strategies
    strategies.names()                      # ('single', 'ddp', 'zero1', ..., 'hybrid_shard'), the ladder's order
    s = strategies.get("zero2")             # its schema, mesh, engines, footprint, collectives, formulas
    strategies.register(Strategy(...))      # a new one: a config choice, a comparison row, an estimate

Modules: record (the Strategy record, and the Call / Wire a plan is made of), schema (what every
strategy's config shares), contract (what the loop may call on an engine), registry; then one
module per engine family, each registering its strategies: single, ddp, zero, fsdp. A strategy's
name is written in its record module and its configs/strategy/<name>.yaml, nowhere else
(tests/strategies/test_registry.py).
"""

from minidist.strategies.record import Call, Strategy, Wire
from minidist.strategies.registry import get, names, records, register, unregister
from minidist.strategies import single, ddp, zero, fsdp  # noqa: E402,F401 - each registers its strategies, in order

__all__ = ["Call", "Strategy", "Wire", "get", "names", "records", "register", "unregister"]
