"""Schedules are data and are checked: every builder passes the check for any size, its simulated
bubble is the formula's, it holds the activations it states; broken lists are refused in one line."""

from __future__ import annotations

import pytest

from minidist.pp import ScheduleError, build, check, cost, simulate
from minidist.pp.check import bubble, held
from minidist.pp.schedule import Action, Kind, Schedule, with_communication

SIZES = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 5, 8, 16)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb_h1"])
def test_every_size_checks_and_its_bubble_is_the_formula(name):
    for p, m in SIZES:
        sched = build(name, p, m)
        simulated = bubble(check(sched))
        assert simulated == pytest.approx(cost.bubble(name, p, m)), (name, p, m, simulated)
        assert [held(sched, r)[0] for r in range(p)] == list(sched.in_flight), (name, p, m)


def test_zb_h1s_bubble_for_unequal_halves():
    for t_f, t_bi, t_bw in ((1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.5, 0.5)):
        costs = {Kind.F: t_f, Kind.BI: t_bi, Kind.BW: t_bw}
        for p, m in SIZES:
            simulated = bubble(simulate(build("zb_h1", p, m), costs))
            assert simulated == pytest.approx(cost.bubble("zb_h1", p, m, 1, t_f, t_bi, t_bw)), (t_f, t_bi, t_bw, p, m)


def test_interleaved_checks_for_every_multiple_of_pp():
    for p in (2, 3, 4):
        for v in (2, 3):
            for m in (p, 2 * p, 4 * p):
                sched = build("interleaved_1f1b", p, m, v)
                assert bubble(check(sched)) == pytest.approx(cost.bubble("interleaved_1f1b", p, m, v))


def test_the_memory_each_schedule_states():
    p, m = 4, 8
    assert build("gpipe", p, m).in_flight == (8, 8, 8, 8)           # every micro-batch
    assert build("1f1b", p, m).in_flight == (4, 3, 2, 1)            # p - r
    assert build("1f1b", p, 2).in_flight == (2, 2, 2, 1)            # fewer micro-batches than stages: fine
    assert build("zb_h1", p, m).in_flight == (4, 4, 4, 4)
    assert build("interleaved_1f1b", p, m, 2).in_flight == (11, 9, 7, 5)   # chunks of half the layers


def test_1f1b_reads_as_its_name():
    assert build("1f1b", 4, 8).table().splitlines()[1] == \
        "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"
    assert build("zb_h1", 2, 3).table().splitlines() == [
        "rank 0: F0 F1 BI0 BW0 F2 BI1 BW1 BI2 BW2", "rank 1: F0 BI0 F1 BI1 BW0 F2 BI2 BW1 BW2"]
    # the send of an activation and the receive of the next gradient are one batch
    assert [str(a) for a in build("1f1b", 2, 2).actions[0]] == [
        "F(0,0)", "SEND_F(0,0)", "F(0,1)", "SEND_F(0,1)", "RECV_B(0,0)", "B(0,0)", "RECV_B(0,1)", "B(0,1)"]


def _hand(orders: list[list[tuple[str, int]]], p: int = 2, m: int = 2, in_flight=None) -> Schedule:
    """A schedule written by hand: per rank (kind, micro-batch) on stage = rank."""
    acts = [[Action(Kind(k), r, i) for k, i in order] for r, order in enumerate(orders)]
    return with_communication("hand", p, m, 1, acts, in_flight or [m] * p)


def test_messages_out_of_order_are_refused_in_one_line():
    # rank 1 runs micro-batch 1 before 0: activation 0 would land in micro-batch 1's buffer
    sched = _hand([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("B", 1), ("F", 0), ("B", 0)]])
    with pytest.raises(ScheduleError) as e:
        check(sched)
    msg = str(e.value)
    assert "\n" not in msg and "rank 0 -> rank 1, message 1" in msg and "matched by order" in msg, msg


def test_what_the_check_catches():
    cases = {
        # micro-batch 1 forwarded twice, never backwarded
        "F x2": _hand([[("F", 0), ("F", 1), ("F", 1), ("B", 0)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]),
        # a backward before its forward
        "before F(1,0)": _hand([[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("B", 0), ("F", 0), ("F", 1), ("B", 1)]]),
        # 1F1B's order stated to hold one activation where it holds two
        "holds 2 activations": _hand([[("F", 0), ("F", 1), ("B", 0), ("B", 1)],
                                      [("F", 0), ("B", 0), ("F", 1), ("B", 1)]], in_flight=[1, 1]),
    }
    for want, sched in cases.items():
        with pytest.raises(ScheduleError, match=want.replace("(", r"\(").replace(")", r"\)")):
            check(sched)
    # a receive whose send never comes: rank 0 never sends activation 1 (it was dropped from its list)
    good = build("1f1b", 2, 2)
    dropped = Schedule("dropped", 2, 2, 1, (tuple(a for a in good.actions[0] if str(a) != "SEND_F(0,1)"),
                                            good.actions[1]), good.in_flight)
    with pytest.raises(ScheduleError, match="the sender posts nothing where the receiver posts RECV_F"):
        check(dropped)


def test_a_blocking_cycle_is_named():
    # both ranks first wait for a gradient the other sends only after its own wait: simulated, refused
    good = build("gpipe", 2, 1)
    r0 = [a for a in good.actions[0] if a.kind is not Kind.SEND_F]
    r0.insert(r0.index(Action(Kind.B, 0, 0)) + 1, Action(Kind.SEND_F, 0, 0))   # sends after its backward
    bad = Schedule("late", 2, 1, 1, (tuple(r0), good.actions[1]), good.in_flight)
    with pytest.raises(ScheduleError) as e:
        simulate(bad)
    assert "deadlock: rank 0 waits at RECV_B(0,0) for rank 1; rank 1 waits at RECV_F(1,0) for rank 0" in str(e.value)


def test_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match=r"microbatches=6 must be a multiple of pp=4 .*valid: 4, 8, 12"):
        build("interleaved_1f1b", 4, 6, 2)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'pipedream'; valid: gpipe, 1f1b"):
        build("pipedream", 2, 4)
    with pytest.raises(ValueError, match="only interleaved_1f1b holds more than one"):
        build("1f1b", 2, 4, virtual=2)


def test_the_bytes_formula():
    sched = build("1f1b", 4, 8)
    assert cost.boundary_bytes(8, 100, 4) == 2 * 8 * 100 * 4
    assert cost.step_bytes(sched, 100, 4) == 3 * 2 * 8 * 100 * 4 / 4          # 3 boundaries over 4 ranks
    assert cost.step_bytes(build("interleaved_1f1b", 4, 8, 2), 100, 4) == 7 * 2 * 8 * 100 * 4 / 4
