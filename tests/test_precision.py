"""One precision for bytes, memory and compute (minidist.precision.RunPrecision)."""

import pytest
import torch

from minidist.precision import RunPrecision


def test_bytes_states_and_flops_follow_the_precision():
    fp32, bf16, fp16 = RunPrecision("fp32"), RunPrecision("bf16"), RunPrecision("fp16")
    assert (fp32.compute_bytes, bf16.compute_bytes, fp16.compute_bytes) == (4, 2, 2)
    assert bf16.dtype == torch.bfloat16 and fp16.dtype == torch.float16
    assert fp32.state_bytes == bf16.state_bytes == 16  # ZeRO's 16 psi: 4 + 4 + 8 or 2 + 2 + 12
    assert bf16.peak_flops("h100") / fp32.peak_flops("h100") > 10  # tensor cores vs CUDA cores
    assert "fp32 masters" in bf16.describe() and "K = 8" in fp32.describe()


def test_bad_precision_or_device_names_what_is_valid():
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        RunPrecision("tf32")
    with pytest.raises(ValueError, match="h100"):
        RunPrecision("bf16").peak_flops("tpu")
