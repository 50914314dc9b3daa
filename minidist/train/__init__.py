"""Training recipes: typed configs, data, the strategy adapter, checkpoints, metrics and the loop.

    cfg = compose_config(["strategy=ddp", "trainer.steps=100"])
    with minidist.runtime.distributed(cfg.backend.value) as topo:
        train(cfg, topo)
"""

from minidist.train.compose import ConfigError, compose_config
from minidist.train.trainer import train

__all__ = ["ConfigError", "compose_config", "train"]
