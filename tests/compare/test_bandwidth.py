"""nccl-tests' algbw and busbw per op of the replayed step: one-rank groups (no bytes moved, no time) left out."""

import pytest

from minidist.comm import CostModel
from minidist.compare.analysis import _alone


def test_one_rank_groups_do_not_inflate_algbw():
    """ddp+tp2 at world 2: TP's all_reduces over 2 ranks, and DDP's bucket over a data-parallel group of one."""
    calls = [{"op": "all_reduce", "payload_bytes": 4_000_000, "group_size": 2, "wire_op": "all_reduce",
              "seconds": [0.004, 0.004]},
             {"op": "all_reduce", "payload_bytes": 4_000_000, "group_size": 1, "wire_op": "all_reduce",
              "seconds": [1e-6, 1e-6]}]
    raws = [{"alone": {"calls": calls}}, {"alone": {"calls": calls}}]
    out = _alone(raws, CostModel(1e-4, 1e-9))
    op = out["ops"]["all_reduce"]
    assert op["calls"] == 1 and op["algbw_GBps"] == pytest.approx(4e6 / 0.004 / 1e9)  # 1.0, not 2.0
    assert op["busbw_GBps"] == pytest.approx(op["algbw_GBps"] * 2 * 1 / 2)
    assert out["seconds"] == pytest.approx(0.004 + 1e-6)  # the step's time alone still counts every call
