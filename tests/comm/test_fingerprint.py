"""Collective fingerprints: with the debug switch on, ranks that are about to issue different
collectives all raise one error naming each rank's collective and call site, and the
group stays usable; agreeing collectives run as before."""

import torch
import torch.distributed as dist

from minidist import comm
from minidist.comm import fingerprint


def _mismatch(fn) -> str | None:
    try:
        fn()
    except comm.CollectiveMismatchError as e:
        return str(e)
    return None


def _fingerprints():
    rank = dist.get_rank()
    comm.set_debug(True)
    out = {}
    try:
        x = torch.full((4,), float(rank + 1))
        comm.all_reduce(x)
        comm.all_reduce(x, async_op=True).wait()
        out["sums"] = x.tolist()
        out["shape"] = _mismatch(lambda: comm.all_reduce(torch.ones(4 if rank == 0 else 8)))
        out["op"] = _mismatch(lambda: comm.all_reduce(torch.ones(4)) if rank == 0 else comm.broadcast(torch.ones(4), src=0))
        out["dtype"] = _mismatch(lambda: comm.all_gather(torch.empty(2), torch.ones(1, dtype=torch.float32 if rank == 0 else torch.float64)))
        y = torch.ones(2)
        comm.all_reduce(y)  # the group is intact: nothing mismatched reached gloo
        out["after"] = y.tolist()
    finally:
        comm.set_debug(False)
    return out


def test_mismatches_raise_on_every_rank(run_dist):
    r0, r1 = run_dist(2, _fingerprints)
    assert r0["sums"] == r1["sums"] == [6.0] * 4, "agreeing collectives run unchanged"
    assert r0["after"] == r1["after"] == [2.0, 2.0]
    for case in ("shape", "op", "dtype"):
        assert r0[case] is not None and r0[case] == r1[case], f"{case}: the same error on every rank"
        assert "Ranks [1] differ from rank 0" in r0[case], r0[case]
        assert r0[case].count("test_fingerprint.py:") == 2, f"each rank's call site: {r0[case]}"
    shape = r0["shape"]
    assert "rank 0 issues all_reduce #" in shape and "float32[4] numel=4" in shape and "float32[8] numel=8" in shape, shape
    op = r0["op"]
    assert "rank 0 issues all_reduce #" in op and "rank 1 issues broadcast #" in op, op
    assert "float32[1]" in r0["dtype"] and "float64[1]" in r0["dtype"], r0["dtype"]


def test_switch_from_environment():
    assert fingerprint.enabled_by_env({"MINIDIST_DEBUG_COLLECTIVES": "1"})
    assert not fingerprint.enabled_by_env({"MINIDIST_DEBUG_COLLECTIVES": "0"})
    assert not fingerprint.enabled_by_env({})
    assert not fingerprint.ENABLED, "off unless asked for"
