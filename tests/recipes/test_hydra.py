"""Hydra's command line as Hydra users know it: --help, --cfg, --info, one-line mistakes, a sweep's order.
A --multirun sweep under torchrun (every rank runs the same jobs; the main process writes) is launched
once, at 4 processes, by tests/recipes/test_tp_recipe.py."""

import pytest
from hydra._internal.utils import get_args_parser
from omegaconf import OmegaConf

from minidist.recipes.train import _check_jobs, main
from minidist.cli.compose import ConfigError


def _info(capsys, *argv) -> str:
    try:
        main(list(argv))
    except SystemExit as exc:  # --help exits 0, as Hydra's does
        assert exc.code in (0, None)
    return capsys.readouterr().out


def test_help_lists_groups_and_options(capsys):
    out = _info(capsys, "--help", "strategy=full_shard")
    assert "strategy: ddp, full_shard, hybrid_shard, no_shard, shard_grad_op, single, zero1, zero1_broadcast, zero2" in out
    assert "experiment: gpt_tiny, main_gpu, resnet_cifar, resnet_synthetic" in out
    assert "schema" not in out  # the typed schemas' own groups are not choices
    line = next(ln for ln in out.splitlines() if "strategy.prefetch:" in ln)
    assert ": 1" in line and "# Units each unit all-gathers ahead of use" in line  # value and description
    assert "trainer.ckpt_interval: 100" in out and "--hydra-help" in out


def test_cfg_and_info_are_hydras(capsys):
    job = OmegaConf.create(_info(capsys, "--cfg", "job", "experiment=gpt_tiny"))
    assert job.model.n_layer == 2 and "hydra" not in job
    assert OmegaConf.create(_info(capsys, "--cfg", "strategy=zero1")).strategy.name == "zero1"  # bare --cfg
    hydra = OmegaConf.create(_info(capsys, "--cfg", "hydra"))
    assert hydra.hydra.job.chdir is False and hydra.hydra.output_subdir is None
    assert hydra.hydra.launcher._target_.endswith("MinidistLauncher")
    resolved = OmegaConf.create(_info(capsys, "--cfg", "all", "--resolve", "strategy=zero1", "out_dir=/o"))
    assert resolved.hydra.run.dir.startswith("/o/gpt-zero1-")  # <out_dir>/<model>-<strategy>-<time>
    assert resolved.hydra.sweep.dir.startswith("/o/multirun-")
    named = OmegaConf.create(_info(capsys, "--cfg", "all", "--resolve", "name=n", "out_dir=/o"))
    assert (named.hydra.run.dir, named.hydra.sweep.dir) == ("/o/n", "/o/n")
    alone = OmegaConf.create(_info(capsys, "--cfg", "hydra", "--resolve"))  # without the run's config
    assert alone.hydra.run.dir == "<out_dir>/<name>"
    info = _info(capsys, "--info", "defaults")
    assert "strategy/ddp" in info and "hydra/launcher/minidist" in info


@pytest.mark.parametrize("argv,expect", [
    (["strategy=ddp,full_shard"], "add --multirun"),
    (["--multirun", "strategy=ddp,zero3"], "strategy/zero3"),  # every job is checked before any runs
    (["--multirun", "model.n_layer=2,x"], "model.n_layer"),
    (["-cp", "/tmp"], "--config-dir"),
    (["model.n_layer=[1"], "model.n_layer"),
    (["+experiment=gpt_tiny"], "experiment=<choice> (no '+')"),
])
def test_command_line_mistakes_are_one_line(argv, expect):
    with pytest.raises(ConfigError) as info:
        _check_jobs(get_args_parser().parse_args(argv))
    assert "\n" not in str(info.value) and expect in str(info.value), str(info.value)


def test_a_sweep_expands_in_hydras_order():
    cfgs = _check_jobs(get_args_parser().parse_args(["-m", "strategy=ddp,full_shard", "model.n_layer=1,2"]))
    assert [(c.strategy.name, c.model.n_layer) for c in cfgs] == [("ddp", 1), ("ddp", 2), ("full_shard", 1),
                                                                  ("full_shard", 2)]
