"""Config composition: every strategy x model composes to its typed schema; mistakes are one line."""

import pytest
from omegaconf import OmegaConf

from minidist.cli.compose import ConfigError, compose_config
from minidist.cli.config import GROUPS
from minidist.strategies.ddp import DDPStrategy
from minidist.strategies.fsdp import FSDPStrategy, HybridShardStrategy
from minidist.strategies.single import SingleStrategy
from minidist.strategies.zero import ZeroStrategy

STRATEGIES = {"single": SingleStrategy, "ddp": DDPStrategy, "zero1": ZeroStrategy, "zero2": ZeroStrategy,
              "zero1_broadcast": ZeroStrategy, "shard_grad_op": FSDPStrategy,
              "full_shard": FSDPStrategy, "no_shard": FSDPStrategy, "hybrid_shard": HybridShardStrategy}


def test_every_strategy_and_model_composes_to_its_schema():
    """Each strategy once, the models and data sources in turn (composition costs ~0.5 s each)."""
    pairs = [("gpt", "stdlib"), ("resnet18", "synthetic"), ("gpt", "synthetic"), ("resnet18", "cifar10")]
    for i, (name, schema) in enumerate(STRATEGIES.items()):
        model, data = pairs[i % len(pairs)]
        cfg = compose_config([f"strategy={name}", f"model={model}", f"data={data}"])
        assert OmegaConf.get_type(cfg.strategy) is schema and cfg.strategy.name == name
        assert cfg.model.name == model and cfg.data.source == data
        assert OmegaConf.get_type(cfg.model) is GROUPS["model"][model]
        assert OmegaConf.get_type(cfg.data) is GROUPS["data"][data]


def test_defaults_are_the_main_job():
    cfg = compose_config()
    assert (cfg.strategy.name, cfg.model.name, cfg.data.source, cfg.optim.name) == ("ddp", "gpt", "stdlib", "adamw")
    assert cfg.logger.mode is None and cfg.resume == "never"  # mode: $WANDB_MODE, else offline
    assert cfg.trainer.ckpt_interval == 100  # the main job leaves checkpoints to resume from


def test_bad_wandb_mode_in_the_environment_is_one_line(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offfline")
    with pytest.raises(ConfigError, match="WANDB_MODE='offfline'.*offline"):
        compose_config()
    compose_config(["logger.mode=disabled"])  # the config's own value wins: the environment is not read


def test_experiments_compose():
    tiny = compose_config(["experiment=gpt_tiny", "strategy=full_shard", "strategy.prefetch=2"])
    assert tiny.model.n_layer == 2 and tiny.strategy.prefetch == 2
    res = compose_config(["experiment=resnet_cifar"])
    assert (res.model.name, res.data.source, res.optim.name, res.trainer.precision.value) == \
        ("resnet18", "cifar10", "sgd", "bf16")
    assert compose_config(["experiment=resnet_synthetic"]).data.source == "synthetic"


@pytest.mark.parametrize("override,expect", [
    ("strategy.bucket_cap=5", ["unknown key 'strategy.bucket_cap'", "bucket_cap_mb"]),
    ("strategy=full_shard strategy.bucket_cap_mb=5", ["unknown key 'strategy.bucket_cap_mb'", "prefetch"]),
    ("trainer.steps=many", ["trainer.steps", "many"]),
    ("trainer.precision=fp8", ["trainer.precision", "fp32", "bf16"]),
    ("strategy=zero3", ["strategy/zero3", "full_shard", "hybrid_shard", "zero1"]),
    ("nme=x", ["unknown key 'nme'", "name"]),
    ("experiment=resnet_synthetic data=cifar10", ["unknown key 'data.train_samples'", "root", "download"]),
    ("model=gpt data=cifar10", ["model=gpt needs token data"]),
    ("experiment=gpt-tiny", ["experiment/gpt-tiny", "gpt_tiny", "resnet_synthetic"]),  # a typo is not ignored
    ("+foo=1", ["unknown key 'foo'", "trainer", "resume"]),
    ("+trainer.foo=3", ["unknown key 'trainer.foo'", "ckpt_interval"]),
    ("~data", ["no data config", "stdlib", "cifar10", "synthetic"]),
    ("strategy=hybrid_shard strategy.shard_size=0", ["strategy.shard_size=0 must be >= 1"]),
    ("strategy.bucket_cap_mb=-1", ["strategy.bucket_cap_mb=-1.0 must be > 0"]),
    ("trainer.log_interval=0", ["trainer.log_interval=0 must be >= 1"]),
    ("trainer.eval_stride=-1", ["trainer.eval_stride=-1 must be >= 0"]),
    ("trainer.preempt_signals=[SIGTERM,SIGFOO]", ["unknown signal 'SIGFOO'", "SIGUSR1"]),
    ("strategy.tp_size=3", ["strategy.tp_size=3 must divide model.n_head=4", "valid: 1, 2, 4"]),
    ("strategy=zero1 strategy.tp_size=2 strategy.vocab_parallel=true model.vocab_size=255",
     ["strategy.tp_size=2 must divide model.vocab_size=255", "valid: 1"]),
    ("strategy=full_shard strategy.tp_size=4 strategy.sequence_parallel=true model.block_size=130",
     ["strategy.tp_size=4 must divide model.block_size=130", "valid: 1, 2"]),
    ("experiment=resnet_synthetic strategy.tp_size=2", ["strategy.tp_size=2", "model=gpt only"]),
    ("strategy.tp_size=0", ["strategy.tp_size=0 must be >= 1"]),
    ("strategy.cp_size=2 model.block_size=30", ["strategy.cp_size=2 must split model.block_size=30 into 4 chunks",
                                                "valid: 1, 3, 5, 15"]),
    ("strategy.cp_size=2 model.dropout=0.1", ["strategy.cp_size=2", "set model.dropout=0"]),
    ("strategy.cp_size=2 strategy.cp_rotate=star", ["strategy.cp_rotate='star'", "ring, all_gather"]),
    ("experiment=resnet_synthetic strategy.cp_size=2", ["strategy.cp_size=2", "model=gpt only"]),
    ("strategy=hybrid_shard strategy.cp_size=2", ["strategy.cp_size=2 must divide the 1 process of the job"]),
    ("strategy.cp_size=2", ["strategy.cp_size=2 must divide the 1 process of the job; valid: 1"]),
    ("strategy.pp_size=2 model.n_layer=4 trainer.batch_size=8 trainer.microbatches=3",
     ["trainer.microbatches=3 must divide trainer.batch_size=8", "valid: 1, 2, 4, 8"]),
    ("strategy.pp_size=3 model.n_layer=4", ["strategy.pp_size=3", "must divide model.n_layer=4", "valid pp_size: 1, 2, 4"]),
    ("strategy=zero2 strategy.pp_size=2 model.n_layer=4 trainer.grad_accum=2",
     ["trainer.grad_accum=2 with strategy.pp_size=2", "trainer.microbatches=2"]),
    ("strategy.pp_size=2 strategy.pp_schedule=interleaved_1f1b strategy.pp_virtual=2 model.n_layer=4 "
     "trainer.microbatches=3 trainer.batch_size=6", ["strategy.pp_schedule=interleaved_1f1b", "multiple of pp=2"]),
    ("strategy=full_shard strategy.pp_size=2 model.n_layer=4 strategy.pp_schedule=zb_h1",
     ["strategy.pp_schedule=zb_h1 with strategy=full_shard", "use gpipe, 1f1b"]),
])
def test_mistakes_are_one_line_naming_key_and_choices(override, expect):
    with pytest.raises(ConfigError) as info:
        compose_config(override.split())
    msg = str(info.value)
    assert "\n" not in msg, msg
    for word in expect:
        assert word in msg, msg
    assert "schema" not in msg.split("valid")[-1], msg  # schema nodes are not offered as choices


def test_cp_degree_that_does_not_divide_the_world_is_one_line(monkeypatch):
    """At 4 processes (torchrun's environment) with tp 2, cp must divide the 2 ranks left: named before any
    process group exists."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError) as info:
        compose_config(["strategy=full_shard", "strategy.tp_size=2", "strategy.cp_size=4", "model.n_head=4"])
    assert str(info.value) == ("strategy.cp_size=4 must divide the 2 ranks (4 processes / strategy.tp_size=2); "
                               "valid: 1, 2"), info.value
    assert compose_config(["strategy=full_shard", "strategy.tp_size=2", "strategy.cp_size=2",
                           "model.n_head=4"]).strategy.cp_size == 2
def test_a_pipeline_degree_that_does_not_divide_the_world_is_one_line():
    with pytest.raises(ConfigError) as info:
        compose_config(["strategy.pp_size=3", "model.n_layer=6", "strategy.tp_size=2", "model.n_head=2"], world=(8, 8))
    msg = str(info.value)
    assert "\n" not in msg and "strategy.pp_size=3 must divide the 4 ranks (8 processes / strategy.tp_size=2)" in msg, msg
    assert compose_config(["strategy.pp_size=2", "model.n_layer=6"], world=(4, 4)).strategy.pp_size == 2
