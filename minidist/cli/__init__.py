"""The command line's machinery: typed configs, their composition and checks, `--help`, Hydra's jobs.

    cfg = compose_config(["strategy=ddp", "trainer.steps=100"])     # one line (ConfigError) if it is wrong
    with minidist.runtime.distributed(cfg.backend.value) as topo:
        minidist.train.train(cfg, topo)

The recipes (minidist.recipes.train, .compare) are its users; the training loop (minidist.train)
knows nothing of it.
"""

from minidist.cli.compose import ConfigError, compose_config

__all__ = ["ConfigError", "compose_config"]
