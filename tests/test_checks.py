"""checks/: the device check cannot pass without a device, and its script does not rot.

gpu.sh on a machine without a CUDA GPU fails with one line (it used to print "check OK on
cpu"). cuda_check.py runs on the CPU too (gloo, a world of one, a smaller model), so every
engine attribute it reads is checked here, where CI runs; on a GPU it checks the CUDA path.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.launches
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu.sh runs for real there")
def test_gpu_check_fails_without_a_gpu():
    out = subprocess.run(["bash", str(ROOT / "checks/gpu.sh")], capture_output=True, text=True, timeout=120,
                         env=os.environ | {"PY": sys.executable})
    assert out.returncode != 0, out
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0], lines


@pytest.mark.launches
def test_cuda_check_script_runs_on_cpu():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, str(ROOT / "checks/cuda_check.py")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "check OK on cpu (gloo), world 1" in out.stdout and "FSDP hybrid_shard" not in out.stdout, out.stdout
    assert out.stdout.count("FSDP ") == 9, out.stdout
