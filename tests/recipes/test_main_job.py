"""The main job (`make train`) as docs/recipes.md records it: the defaults compose to the configuration
the sweep there chose, and `make train` adds the GPU preset only where nvidia-smi lists GPUs."""

import re
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

from minidist.cli.compose import compose_config

REPO = Path(__file__).resolve().parents[2]


def _documented_settings() -> dict[str, str]:
    """The `key=value` words of the block that follows "The main job's settings" in docs/recipes.md."""
    text = (REPO / "docs" / "recipes.md").read_text()
    block = re.search(r"The main job's settings.*?```\n(.*?)```", text, re.S)
    assert block, "docs/recipes.md lost the main job's settings block"
    return dict(word.split("=", 1) for word in block.group(1).split())


def test_defaults_are_the_documented_main_job():
    settings = _documented_settings()
    cfg = compose_config([], world=(2, 2))
    assert len(settings) >= 8
    for key, value in settings.items():
        assert str(OmegaConf.select(cfg, key)) == value, (key, OmegaConf.select(cfg, key), value)


def _make_train(*args: str) -> str:
    out = subprocess.run(["make", "-n", "train", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return next(line for line in out.stdout.splitlines() if "recipes.train" in line)


def test_make_train_uses_the_gpu_preset_on_gpus_only():
    cpu = _make_train("GPUS=0")
    assert "--nproc_per_node=2" in cpu and "experiment=" not in cpu and "minidist.recipes.torchrun" in cpu
    gpu = _make_train("GPUS=8")
    assert "--nproc_per_node=8" in gpu and "experiment=main_gpu" in gpu
    assert "experiment=main_gpu" not in _make_train("GPUS=8", "ARGS=experiment=gpt_tiny")  # the user's choice
    compose_config(["experiment=main_gpu"], world=(8, 8))  # the preset composes, its model builds
