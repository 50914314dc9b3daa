"""The training loop and what it keeps: data, the step, metrics, checkpoints, the run directory, preemption.

    cfg = minidist.cli.compose_config(["strategy=ddp", "trainer.steps=100"])
    with minidist.runtime.distributed(cfg.backend.value) as topo:
        train(cfg, topo)
"""

from minidist.train.trainer import train

__all__ = ["train"]
