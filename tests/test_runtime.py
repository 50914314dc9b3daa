"""The runtime: a world of one without torchrun, backend choice, clean errors."""

import os
import subprocess
import sys

import pytest

from minidist import runtime

SCRIPT = """
import torch, minidist
import torch.distributed as dist
from minidist import comm
try:
    with minidist.runtime.distributed():
        raise KeyError("x")
except KeyError:
    print("initialized after an exception:", dist.is_initialized())
with minidist.runtime.distributed(backend="auto", timeout_s=30) as topo:
    t = torch.tensor([5.0])
    with comm.trace() as tr:
        comm.all_reduce(t)
        comm.all_gather(torch.empty(1), torch.tensor([2.0]))
    print(topo.rank, topo.world_size, topo.backend, topo.device, t.item(), tr.sent_bytes)
print("initialized after exit:", dist.is_initialized())
try:
    minidist.runtime.resolve_backend("mpi")
except Exception as e:
    minidist.runtime.exit_on_error(e)  # a script that ran gloo ends through exit_process (teardown can abort)
"""


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@pytest.mark.launches
def test_world_of_one_without_torchrun_and_an_error_in_one_line():
    """One plain process (no torchrun): the process group is destroyed when the body raises; a world of one
    runs collectives on gloo and is gone after the block; exit_on_error prints one line and exits 1. Nothing
    else reaches stderr (no warnings)."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines() == ["initialized after an exception: False", "0 1 gloo cpu 5.0 0",
                                       "initialized after exit: False"], out.stdout + out.stderr
    assert out.returncode == 1
    assert out.stderr.splitlines() == ["error: ValueError: backend must be one of ('auto', 'gloo', 'nccl'), got 'mpi'"]


def test_backend_resolution():
    assert runtime.resolve_backend("gloo") == "gloo"
    with pytest.raises(ValueError, match="backend must be one of"):
        runtime.resolve_backend("mpi")
    import torch
    if not torch.cuda.is_available():
        assert runtime.resolve_backend("auto") == "gloo"
        with pytest.raises(RuntimeError, match="needs CUDA"):
            runtime.resolve_backend("nccl")
