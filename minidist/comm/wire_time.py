"""When a collective's bytes were on the wire: an estimate from issue and completion times alone.

A traced collective (minidist.comm.trace) knows when this rank issued it and when it
completed; the span between includes whatever the caller computed meanwhile, the time the
collective queued behind its group's previous one and the wait for the slowest peer. The
estimate that the cost model's prediction is compared with removes all three:

    wire     completed - max(issued, the last member's issue (arrived), completion of the
             previous collective of its group)

``arrivals`` finds `arrived` from every rank's records (the k-th collective of a group is
the same call on every rank), ``wire_times`` applies the definition record by record.
"""

from __future__ import annotations

from typing import Sequence


def arrivals(issued_by_rank: Sequence[Sequence[tuple[str, float]]]) -> list[list[float]]:
    """Per rank and record, when the last member of its group issued it: the earliest it can start.

    issued_by_rank[r] = [(group name, issued_s), ...] of rank r's records in issue order. Every
    rank issues a group's collectives in the same order, so the k-th record of group g on one
    rank and the k-th of g on another are the same collective. Clocks: perf_counter() of one
    machine, or each rank's shifted to a common barrier.
    """
    latest: dict[tuple[str, int], float] = {}
    keys = []
    for records in issued_by_rank:
        seen: dict[str, int] = {}
        mine = []
        for group, issued in records:
            k = (group, seen.get(group, 0))
            seen[group] = k[1] + 1
            latest[k] = max(latest.get(k, issued), issued)
            mine.append(k)
        keys.append(mine)
    return [[latest[k] for k in mine] for mine in keys]


def wire_times(records: Sequence[tuple[str, float, float | None]],
               arrived: Sequence[float] | None = None) -> list[float | None]:
    """Per (group, issued, completed) record, the estimated seconds its bytes were on the wire.

    A group runs its collectives in order (one NCCL stream; gloo's queue; one ring lane), so a
    collective starts moving bytes when the last member issued it (`arrived`, from arrivals();
    default: this rank's issue) or when the previous one of its group completed, whichever is
    later. This drops the compute an async collective overlapped, the time it queued behind its
    predecessor and, with `arrived`, the wait for a late peer. Where gloo runs two of a group's
    collectives at once (it has 2 threads) it under-counts the later one. None: not completed.
    """
    arrived = arrived or [issued for _, issued, _ in records]
    out: list[float | None] = [None] * len(records)
    done: dict[str, float] = {}
    for i in sorted(range(len(records)), key=lambda j: records[j][1]):
        group, issued, completed = records[i]
        if completed is None:
            continue
        start = max(issued, arrived[i], done.get(group, issued))
        out[i] = max(0.0, completed - start)
        done[group] = max(done.get(group, completed), completed)
    return out
