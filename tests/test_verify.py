"""verify_same_model: the construction-time check every engine runs (DDP, FSDP, ZeRO)."""

import torch.distributed as dist
import torch.nn as nn

from minidist.verify import verify_same_model


def _verify(engine: str):
    rank = dist.get_rank()
    same = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    verify_same_model(same.named_parameters(), same.named_buffers(), None, engine)  # passes
    different = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5 if rank == 0 else 6))
    try:
        verify_same_model(different.named_parameters(), different.named_buffers(), None, engine)
    except RuntimeError as e:
        return str(e)
    return None


def test_different_models_raise_on_every_rank(run_dist):
    for rank, err in enumerate(run_dist(2, _verify, "FSDP")):
        assert err is not None, f"rank {rank} did not raise"
        assert err.startswith("FSDP: ranks built different models."), err
        assert f"parameter '1.weight' shape=({5 + rank}, 4)" in err, err
        assert f"ranks [{rank}] (of 2) agree with this rank" in err and err.endswith("wrapping it in FSDP."), err
