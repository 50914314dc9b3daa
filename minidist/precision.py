"""Mixed precision, shared by every engine: which dtype each copy of the model lives in.

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

A training step touches three copies of the weights and their gradients:

    master parameters   fp32, what the optimizer updates (and its state: Adam's
                        two moments, so 4 + 8 = 12 bytes per parameter, K = 12)
    compute parameters  param_dtype (bf16/fp16: 2 bytes), what forward and backward read
    gradients           produced in param_dtype, reduced across ranks in reduce_dtype,
                        accumulated into the fp32 master gradient

which is the (2 + 2 + K) psi of the ZeRO paper. Casting the parameters once per
step at the module boundary (not per op, as autocast does) is what lets a
sharded engine all_gather half the bytes.

Why divide before *and* after the sum: an fp16 gradient summed over N ranks can
overflow (fp16's largest value is 65504) even when the average is small, and a
gradient divided by N before summing can underflow. Dividing by about sqrt(N)
before and the rest after keeps both in range; bf16 and fp32 have fp32's
exponent range, so they divide once, after the sum (cheaper: the reduced tensor
is smaller or equal). This is FSDP2's rule (`_get_gradient_divide_factors`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """As torch's FSDP2 policy: param_dtype for the parameters' compute copy (and an
    all_gather's payload), reduce_dtype for gradient reduction.

    The master parameters, their gradients and the optimizer state stay in the
    module's dtype (fp32). reduce_dtype None = param_dtype (None too = no casts).
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None

    def reduce_dtype_for(self, master_dtype: torch.dtype) -> torch.dtype:
        """The dtype gradients are reduced in, given the master parameters' dtype."""
        return self.reduce_dtype or self.param_dtype or master_dtype


def divide_factors(world_size: int, reduce_dtype: torch.dtype) -> tuple[float, float]:
    """(pre, post): divide the gradient by `pre` before the sum over `world_size` ranks
    and by `post` after it; pre * post = world_size.

    fp16 (overflow risk): pre doubles from 1 while it divides N and is below
    N / pre, so it ends near sqrt(N) (N = 64: 8 and 8), as FSDP2 chooses it;
    bf16, fp32 or one rank: (1, N).
    """
    if reduce_dtype in (torch.float32, torch.float64, torch.bfloat16) or world_size == 1:
        return 1.0, float(world_size)
    pre = 1
    while world_size % pre == 0 and world_size / pre > pre:
        pre *= 2
    return float(pre), world_size / pre


def cast_floating(tree, dtype: torch.dtype):
    """`tree` (args, kwargs, nested lists/dicts) with every floating tensor cast to `dtype`.

    What an engine that computes in param_dtype does to a module's inputs (FSDP2's
    cast_forward_inputs): a float32 batch meets bf16 weights in the first layer.
    """
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x, tree)


# --------------------------------------------------------------------------- a run's precision, for the numbers

PEAK_FLOPS = {
    # dense tensor-core peaks from NVIDIA's datasheets (FLOP/s, no sparsity); fp32 is the CUDA-core rate that
    # torch's default matmul precision ("highest") runs at (TF32, 7.4x faster on H100, is an opt-in)
    "h100": {"fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12},  # H100 SXM5
    "h200": {"fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12},  # H200 SXM: H100's compute, more memory
    "a100": {"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12},  # A100 SXM4
}


def loss_scaler(precision: str, device_type: str):
    """fp16's loss scaler, else None: torch's ShardedGradScaler, whose inf check is all_reduced so that every
    rank skips a step together (a rank that skipped alone would leave the replicas apart). Imported here,
    when a run asks for fp16: its module imports torch's FSDP (~0.9 s of CPU in every process)."""
    if precision != "fp16":
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    return ShardedGradScaler(device_type)


@dataclass(frozen=True)
class RunPrecision:
    """A run's precision, the one bytes, memory and compute are all priced at (trainer.precision's names).

        fp32   everything fp32: parameters, gradients, activations, collectives 4 bytes; Adam K = 8
               (two moments); compute at the fp32 rate
        bf16   minidist's engines: fp32 masters, a bf16 compute copy of the parameters, bf16
        fp16   activations and gradients, collectives in the compute dtype (reduce_dtype defaults to
               it); Adam K = 12 (fp32 masters + two moments), ZeRO's p = g = 2; compute at the
               tensor-core rate; fp16 adds a loss scale (no bytes)

    ZeRO's model states per parameter, (p + g + K): 16 bytes either way (4 + 4 + 8 or 2 + 2 + 12), which is
    why a bf16 run saves memory in activations and communication, not in states.
    """

    name: str = "fp32"

    def __post_init__(self):
        if self.name not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {self.name!r}")

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (activations, the parameters' compute copy, gradients as produced)."""
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of activations, compute parameters, gradients and the collectives that move them."""
        return 4 if self.name == "fp32" else 2

    @property
    def optimizer_bytes(self) -> int:
        """K: Adam's bytes per parameter beyond p and g (the fp32 masters too when they are not p)."""
        return 8 if self.name == "fp32" else 12

    @property
    def state_bytes(self) -> int:
        """p + g + K per parameter (ZeRO's 16 psi)."""
        return 2 * self.compute_bytes + self.optimizer_bytes

    def peak_flops(self, device: str) -> float:
        """The device's dense peak FLOP/s at this precision (PEAK_FLOPS: h100, h200, a100)."""
        if device not in PEAK_FLOPS:
            raise ValueError(f"no peak FLOP/s for {device!r}; known: {', '.join(PEAK_FLOPS)}")
        return PEAK_FLOPS[device][self.name]

    def describe(self) -> str:
        """The precision stated, as every number priced at it should say."""
        if self.name == "fp32":
            return "fp32 (4-byte activations and collectives; p = g = 4, K = 8 bytes per parameter)"
        return (f"{self.name} with fp32 masters ({self.compute_bytes}-byte activations and collectives; "
                f"p = g = 2, K = 12 bytes per parameter)")
