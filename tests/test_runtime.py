"""The runtime: a world of one without torchrun, backend choice, clean errors."""

import os
import subprocess
import sys

import pytest

from minidist import runtime

SCRIPT = """
import torch, minidist
from minidist import comm
with minidist.runtime.distributed(backend="auto", timeout_s=30) as topo:
    t = torch.tensor([5.0])
    with comm.trace() as tr:
        comm.all_reduce(t)
        comm.all_gather(torch.empty(1), torch.tensor([2.0]))
    print(topo.rank, topo.world_size, topo.backend, topo.device, t.item(), tr.sent_bytes)
import torch.distributed as dist
print("initialized after exit:", dist.is_initialized())
minidist.runtime.exit_process(0)  # a script that ran gloo ends so (the interpreter's teardown can abort)
"""


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def test_world_of_one_without_torchrun():
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["0 1 gloo cpu 5.0 0", "initialized after exit: False"]
    assert out.stderr == ""  # no warnings


def test_process_group_destroyed_on_exception():
    script = "import minidist, torch.distributed as dist\ntry:\n" \
             "    with minidist.runtime.distributed(): raise KeyError('x')\nexcept KeyError: print(dist.is_initialized())"
    out = subprocess.run([sys.executable, "-c", script], env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_exit_on_error_prints_one_line():
    script = "import minidist\ntry:\n    minidist.runtime.resolve_backend('mpi')\nexcept Exception as e:\n" \
             "    minidist.runtime.exit_on_error(e)"
    out = subprocess.run([sys.executable, "-c", script], env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == ["error: ValueError: backend must be one of ('auto', 'gloo', 'nccl'), got 'mpi'"]


def test_backend_resolution():
    assert runtime.resolve_backend("gloo") == "gloo"
    with pytest.raises(ValueError, match="backend must be one of"):
        runtime.resolve_backend("mpi")
    import torch
    if not torch.cuda.is_available():
        assert runtime.resolve_backend("auto") == "gloo"
        with pytest.raises(RuntimeError, match="needs CUDA"):
            runtime.resolve_backend("nccl")
