"""A schedule is proven sound before it runs: a wrong one would hang, or worse, swap two tensors.

    check(sched)              # raises ScheduleError with one line naming the problem; returns the simulation
    simulate(sched, COSTS)    # when each compute action would run, in units of a forward

What is checked, in order (each step assumes the ones before it):

  1. coverage   every stage of a rank runs F, and B (or BI and BW), once per micro-batch, on the
                rank that holds it, and nothing else
  2. order      on each rank, every action comes after what it needs: F(s, i) after the input
                (RECV_F, or F(s-1, i) on the same rank), a backward after its F and its output
                gradient (RECV_B, or the next stage's backward on the same rank), BW after BI,
                a SEND after the action that made its tensor
  3. pairing    for every pair of ranks and direction, the messages the sender posts come in
                exactly the order the receiver posts their receives: messages between two ranks
                are matched by order alone (minidist.comm.p2p), so any other order delivers a
                tensor into the wrong buffer
  4. deadlock   the blocking order simulated as the runtime executes it: a run of SEND/RECV
                actions is one batch; its sends are posted without waiting, its receives wait
                for their sends; compute takes COSTS. No rank may wait forever.
  5. memory     on each rank, the activations held at once (F run, its backward not finished)
                never exceed what the schedule states (Schedule.in_flight)

Why simulate instead of trusting the builders: a schedule is data, and data can be written
by hand, loaded, or built by a builder with a bug; the runtime only walks the lists.
"""

from __future__ import annotations

from collections import Counter

from minidist.pp.schedule import BACKWARD_INPUT, Action, Kind, Schedule

COSTS = {Kind.F: 1.0, Kind.B: 2.0, Kind.BI: 1.0, Kind.BW: 1.0}
"""Time of each compute action in units of a forward: a backward costs two, half of it the input's."""

Spans = list[list[tuple[Action, float, float]]]
"""Per rank, (compute action, start, end)."""


class ScheduleError(ValueError):
    """The schedule would not run correctly; the message says where, in one line."""


def check(schedule: Schedule) -> Spans:
    """Raise ScheduleError unless `schedule` is sound (module docstring); returns its simulation."""
    _coverage(schedule)
    _order(schedule)
    _pairing(schedule)
    spans = simulate(schedule)
    _memory(schedule)
    return spans


def _fail(schedule: Schedule, what: str) -> None:
    s = schedule
    raise ScheduleError(f"schedule {s.name} (pp={s.pp}, microbatches={s.microbatches}, virtual={s.virtual}): {what}")


def _coverage(s: Schedule) -> None:
    if len(s.actions) != s.pp:
        _fail(s, f"{len(s.actions)} action lists for {s.pp} ranks")
    for r in range(s.pp):
        counts = Counter((a.kind, a.stage, a.microbatch) for a in s.compute(r))
        for a in s.actions[r]:
            if a.stage not in s.stages_of(r) or not 0 <= a.microbatch < s.microbatches:
                _fail(s, f"rank {r} runs {a}, but holds stages {s.stages_of(r)} of micro-batches "
                         f"0..{s.microbatches - 1}")
        for st in s.stages_of(r):
            for i in range(s.microbatches):
                f, b, bi, bw = (counts[(k, st, i)] for k in (Kind.F, Kind.B, Kind.BI, Kind.BW))
                if f != 1 or not ((b, bi, bw) == (1, 0, 0) or (b, bi, bw) == (0, 1, 1)):
                    _fail(s, f"rank {r} runs stage {st}, micro-batch {i}: F x{f}, B x{b}, BI x{bi}, BW x{bw} "
                             f"(each needs F once and B once, or BI and BW once)")


def _needs(s: Schedule, a: Action) -> list[tuple[frozenset, int, int]]:
    """What must come before `a` on its own rank: (any of these kinds, stage, micro-batch) each."""
    st, i, r, last = a.stage, a.microbatch, s.rank_of(a.stage), s.num_stages - 1
    forward, backward = frozenset({Kind.F}), BACKWARD_INPUT
    if a.kind is Kind.F and st > 0:
        return [(frozenset({Kind.RECV_F}), st, i) if s.rank_of(st - 1) != r else (forward, st - 1, i)]
    if a.kind in BACKWARD_INPUT:
        after = [] if st == last else [
            (frozenset({Kind.RECV_B}), st, i) if s.rank_of(st + 1) != r else (backward, st + 1, i)]
        return [(forward, st, i)] + after
    return {Kind.BW: [(frozenset({Kind.BI}), st, i)], Kind.SEND_F: [(forward, st, i)],
            Kind.SEND_B: [(backward, st, i)]}.get(a.kind, [])  # a receive: paired with its send in step 3


def _order(s: Schedule) -> None:
    for r in range(s.pp):
        done: set[tuple] = set()
        for a in s.actions[r]:
            for kinds, stage, i in _needs(s, a):
                if not any((k, stage, i) in done for k in kinds):
                    what = " or ".join(sorted(k.value for k in kinds))
                    _fail(s, f"rank {r} runs {a} before {what}({stage},{i}), which it needs")
            done.add((a.kind, a.stage, a.microbatch))


def message(s: Schedule, a: Action) -> tuple[int, int, tuple[str, int, int]]:
    """(sender rank, receiver rank, what) of a SEND or RECV: what = (direction, boundary, micro-batch),
    boundary b lying between stages b and b + 1."""
    st, i = a.stage, a.microbatch
    boundary = {Kind.SEND_F: st, Kind.RECV_F: st - 1, Kind.SEND_B: st - 1, Kind.RECV_B: st}[a.kind]
    forward = a.kind in (Kind.SEND_F, Kind.RECV_F)
    src, dst = (boundary, boundary + 1) if forward else (boundary + 1, boundary)
    return s.rank_of(src), s.rank_of(dst), ("activation" if forward else "gradient", boundary, i)


def _pairing(s: Schedule) -> None:
    sent: dict[tuple[int, int], list] = {}
    received: dict[tuple[int, int], list] = {}
    for r in range(s.pp):
        for a in s.actions[r]:
            if a.kind.is_comm:
                src, dst, what = message(s, a)
                is_send = a.kind in (Kind.SEND_F, Kind.SEND_B)
                (sent if is_send else received).setdefault((src, dst), []).append((what, a))
    for channel in sorted(set(sent) | set(received)):
        out, into = sent.get(channel, []), received.get(channel, [])
        for k in range(max(len(out), len(into))):
            o = out[k][0] if k < len(out) else None
            n = into[k][0] if k < len(into) else None
            if o != n:
                _fail(s, f"rank {channel[0]} -> rank {channel[1]}, message {k + 1}: the sender posts "
                         f"{_say(out, k)} where the receiver posts {_say(into, k)} (messages between two ranks "
                         f"are matched by order)")


def _say(posted: list, k: int) -> str:
    if k >= len(posted):
        return "nothing"
    (direction, boundary, i), a = posted[k]
    return f"{a} (the {direction} of micro-batch {i} across boundary {boundary}|{boundary + 1})"


def simulate(schedule: Schedule, costs: dict[Kind, float] | None = None) -> Spans:
    """When each compute action runs if compute takes `costs` (default COSTS) and messages take no time,
    executed as the runtime does (module docstring, step 4). ScheduleError if some rank waits forever.

    A send completes once its receive is posted (gloo's sends wait for the receiver). The runtime
    posts a batch, then waits for the previous batch's sends (their tensors are freed there, not
    at the end of the step) and this batch's receives; at the end, for the last sends. So does
    this simulation.
    """
    s, costs = schedule, costs or COSTS
    sent: dict[tuple, float] = {}
    received: dict[tuple, float] = {}
    unsent: list[list[tuple]] = [[] for _ in range(s.pp)]
    """Per rank, the sends it has not waited for yet (the previous batch's, and the current one's)."""
    pc, clock, posted = [0] * s.pp, [0.0] * s.pp, [0] * s.pp
    spans: Spans = [[] for _ in range(s.pp)]

    def done(r: int) -> bool:
        return pc[r] >= len(s.actions[r]) and not unsent[r]

    while not all(done(r) for r in range(s.pp)):
        progressed = False
        for r in range(s.pp):
            while not done(r):
                acts = s.actions[r]
                if pc[r] < len(acts) and not acts[pc[r]].kind.is_comm:
                    a = acts[pc[r]]
                    spans[r].append((a, clock[r], clock[r] + costs[a.kind]))
                    clock[r] += costs[a.kind]
                    pc[r], progressed = pc[r] + 1, True
                    continue
                batch = _batch(acts, pc[r]) if pc[r] < len(acts) else ()
                if not posted[r]:
                    for a in batch:
                        m = message(s, a)
                        (sent if a.kind in (Kind.SEND_F, Kind.SEND_B) else received).setdefault(m, clock[r])
                    posted[r] = len(unsent[r]) + 1  # the sends before this mark are the previous batch's
                    unsent[r] += [message(s, a) for a in batch if a.kind in (Kind.SEND_F, Kind.SEND_B)]
                earlier = unsent[r][:posted[r] - 1] if batch else unsent[r]
                waits = [message(s, a) for a in batch if a.kind in (Kind.RECV_F, Kind.RECV_B)]
                if not all(m in received for m in earlier) or not all(m in sent for m in waits):
                    break
                clock[r] = max([clock[r]] + [received[m] for m in earlier] + [sent[m] for m in waits])
                unsent[r] = unsent[r][len(earlier):]
                pc[r], posted[r], progressed = pc[r] + len(batch), 0, True
        if not progressed:
            _fail(s, "deadlock: " + "; ".join(_blocked(s, r, pc[r], unsent[r], sent, received)
                                              for r in range(s.pp) if not done(r)))
    return spans


def _batch(acts: tuple[Action, ...], at: int) -> tuple[Action, ...]:
    """The run of SEND/RECV actions starting at `at`."""
    end = at
    while end < len(acts) and acts[end].kind.is_comm:
        end += 1
    return acts[at:end]


def _blocked(s: Schedule, r: int, at: int, unsent: list, sent: dict, received: dict) -> str:
    acts = s.actions[r]
    waiting = [a for a in (_batch(acts, at) if at < len(acts) else ()) if a.kind in (Kind.RECV_F, Kind.RECV_B)
               and message(s, a) not in sent]
    if waiting:
        return f"rank {r} waits at {waiting[0]} for rank {message(s, waiting[0])[0]}"
    m = next(m for m in unsent if m not in received)
    return f"rank {r} waits for rank {m[1]} to receive its {m[2][0]} of micro-batch {m[2][2]}"


def _memory(s: Schedule) -> None:
    for r in range(s.pp):
        peak, at = held(s, r)
        if peak > s.in_flight[r]:
            _fail(s, f"rank {r} holds {peak} activations at {at}, more than the {s.in_flight[r]} it states")


def held(schedule: Schedule, rank: int) -> tuple[int, Action | None]:
    """The most activations `rank` holds at once (F run, B or BW not yet), and the action that first reaches it."""
    count, peak, at = 0, 0, None
    for a in schedule.compute(rank):
        count += 1 if a.kind is Kind.F else -1 if a.kind in (Kind.B, Kind.BW) else 0
        if count > peak:
            peak, at = count, a
    return peak, at


def bubble(spans: Spans) -> float:
    """The share of the ranks' time spent idle: 1 - busy / (ranks x makespan)."""
    end = max(e for rank in spans for _, _, e in rank)
    busy = sum(e - b for rank in spans for _, b, e in rank)
    return 1.0 - busy / (len(spans) * end)
