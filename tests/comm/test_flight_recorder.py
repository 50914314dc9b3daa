"""The flight recorder: what it keeps per collective (metadata, never a tensor), what it publishes for
its peers, and the one line a skipped collective produces within the timeout (two real gloo worlds)."""

import contextlib
import json
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.comm import flight_recorder as fr
from minidist.comm import peer_progress
from tests.comm import hang_worker

ROOT = Path(__file__).resolve().parents[2]


def _wait_until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def _records(dump_path):
    rank = dist.get_rank()
    x = torch.ones(8)
    comm.all_reduce(x)
    comm.all_gather(torch.empty(16), x, async_op=True).wait()
    comm.barrier()
    _wait_until(lambda: all(e.state is fr.State.COMPLETED for e in fr.entries()[-3:]))
    last = fr.entries()[-3:]
    rows = [e.to_json() for e in last]
    path = fr.dump(f"{dump_path}.{rank}")
    doc = json.loads(Path(path).read_text())
    seq = last[-1].seq
    key, ranks = last[-1].group.key, last[-1].group.ranks
    other = 1 - rank
    published = _wait_until(lambda: peer_progress.progress(key, ranks, rank) == {other: (seq, "barrier")})
    group = last[-1].group
    verdicts = [fr._peers(fr.Entry(seq + 1, "all_reduce", group, None, 0, ("x", 1))),  # the peer is not there yet
                fr._peers(fr.Entry(seq, "all_reduce", group, None, 0, ("x", 1))),      # it issued another op as #seq
                fr._peers(fr.Entry(seq, "barrier", group, None, 0, ("x", 1)))]         # it is in the same one
    dist.barrier()  # torch's own, not counted: neither rank issues #seq+1 before both have read the other's progress
    fr.set_enabled(True, capacity=4)
    try:
        for _ in range(6):
            comm.all_reduce(x)
        kept = [e.seq for e in fr.entries()]
    finally:
        fr.set_enabled(True, capacity=fr.CAPACITY)
    return rows, doc, published, verdicts, seq, kept


def test_records_publishes_and_dumps(run_dist, tmp_path):
    for rank, (rows, doc, published, verdicts, seq, kept) in enumerate(run_dist(2, _records, str(tmp_path / "d"))):
        assert [r["op"] for r in rows] == ["all_reduce", "all_gather", "barrier"]
        assert [r["seq"] for r in rows] == [seq - 2, seq - 1, seq], "one sequence number per collective on the group"
        assert [r["bytes"] for r in rows] == [32, 64, 0] and [r["async_op"] for r in rows] == [False, True, False]
        assert all(r["state"] == "completed" and r["group"] == "world" and r["group_ranks"] == [0, 1] for r in rows)
        assert all("test_flight_recorder.py:" in r["call_site"] for r in rows), rows
        assert all(r["completed_at"] >= r["issued_at"] for r in rows)
        assert doc["rank"] == rank and doc["entries"][-3:] == rows
        assert published, "the peer's progress reached the store within a few publish periods"
        assert verdicts == [f"rank {1 - rank} never reached it (its last on this group: #{seq})",
                            f"rank {1 - rank} issued barrier as #{seq} (the ranks disagree: MINIDIST_DEBUG_COLLECTIVES=1 "
                            f"names where)",
                            "every rank reached it (one died, or the network failed, inside it?)"], verdicts
        assert kept == list(range(seq + 1, seq + 7))[-4:], "the ring keeps the last `capacity` collectives"


def _keeps_no_tensor() -> dict:
    """An async collective's tensors die with the caller's last reference, recorder on, traced or not;
    its entry completes by itself (no later collective needed to settle it)."""
    out = {}
    for traced in (False, True):
        with comm.trace() if traced else contextlib.nullcontext():
            for kind in ("work", "future"):
                x = torch.ones(1 << 16)
                alive = weakref.ref(x)
                work = comm.all_reduce(x, async_op=True)
                (work.get_future() if kind == "future" else work).wait()
                entry = fr.entries()[-1]
                out[traced, kind, "settled"] = _wait_until(lambda: entry.state is fr.State.COMPLETED, 2.0)
                del work, x  # (the done-callback may still be running on gloo's thread for a moment)
                out[traced, kind, "freed"] = _wait_until(lambda: alive() is None, 2.0)
    dist.barrier()
    return out


def test_the_recorder_and_the_trace_keep_no_tensor(run_dist):
    for out in run_dist(2, _keeps_no_tensor):
        assert all(out.values()), out


def test_on_error_leaves_other_errors_alone():
    plain = ValueError("config: timeout_s must be positive")
    assert fr.on_error(plain) is plain, "not a backend error: untouched, even if it says timeout"


@pytest.mark.launches
def test_a_skipped_collective_is_named_within_the_timeout(tmp_path):
    """Rank 1 skips all_reduce #3 (blocking), then #1 on another group (async + wait); rank 0 names each in one line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs, logs = [], []
    try:
        for rank in (1, 0):
            logs.append((open(tmp_path / f"r{rank}.out", "w"), open(tmp_path / f"r{rank}.err", "w")))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.comm.hang_worker", str(rank), str(tmp_path / "store"), str(tmp_path / "run")],
                cwd=ROOT, env={**env, "RANK": str(rank)}, stdout=logs[-1][0], stderr=logs[-1][1]))
        procs[1].wait(timeout=120)  # startup under load dominates; the hang itself is timed below
        ended = time.time()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for out, err in logs:
            out.close()
            err.close()
    err = (tmp_path / "r0.err").read_text().splitlines()
    assert procs[1].returncode == 1 and len(err) == 3, err
    entered = {line.split()[1]: float(line.split()[-1]) for line in (tmp_path / "r0.out").read_text().splitlines()}
    for stage, till in (("sync", entered["async"]), ("async", ended)):
        assert till - entered[stage] < hang_worker.TIMEOUT_S + 4, f"{stage}: reported {till - entered[stage]:.1f}s in"
    first = err[0].split("flight recorder (SIGUSR1): all_reduce #3 on group ", 1)[1].split(" ", 1)[0]
    head = f"all_reduce #3 on group {first} (ranks 0, 1)"
    missing = "rank 1 never reached it (its last on this group: #2)"
    # SIGUSR1 1 s into the hang, answered while the main thread is blocked inside gloo
    assert err[0].startswith(f"[rank 0/2] flight recorder (SIGUSR1): {head} in flight for 1."), err
    assert missing in err[0], err
    within = f"did not complete within {hang_worker.TIMEOUT_S}."
    assert err[1].startswith(f"[rank 0/2] error: CollectiveTimeoutError: {head} {within}"), err
    assert missing in err[1] and "hang_worker.py:" in err[1], err
    second = err[2].split("error: CollectiveTimeoutError: all_reduce #1 on group ", 1)
    assert second[0] == "[rank 0] " and f"(ranks 0, 1) {within}" in second[1], err
    assert not second[1].startswith(f"{first} ") and "rank 1 never reached it (it issued none on this group)" in second[1], err
    doc = json.loads((tmp_path / "run" / "flight_rank0.json").read_text())
    states = [(e["op"], e["seq"], e["group"] == first, e["state"]) for e in doc["entries"]]
    assert states == [("all_reduce", 1, True, "completed"), ("broadcast", 2, True, "completed"),
                      ("all_reduce", 3, True, "failed"), ("all_reduce", 1, False, "failed")], states
