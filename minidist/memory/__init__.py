"""minidist.memory: memory by formula at any scale, each formula checked against torch's allocator at small scale.

    from minidist.memory import activation_bytes, GPTShape, Parallelism
    activation_bytes(GPTShape.of(cfg, batch=8), "bf16", Parallelism(tp=2, sequence_parallel=True)).total
"""

from minidist.memory.activations import Activations, GPTShape, Parallelism, activation_bytes, korthikanti

__all__ = ["Activations", "GPTShape", "Parallelism", "activation_bytes", "korthikanti"]
