"""The wheel's packages; everything else is in pyproject.toml.

This file exists for what pyproject.toml cannot say: the checkout's top-level configs/
(the source of the Hydra presets, edited there) is shipped inside the package as
minidist/configs, beside the discovered packages, so an installed minidist finds its
configs (minidist.cli.config.CONFIG_DIR). Also shipped: minidist's Hydra launcher in the
hydra_plugins namespace, where Hydra looks for plugins. recipes/ (shims for
`torchrun -m recipes.train` in a checkout) is not installed.
"""

from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup

HERE = Path(__file__).resolve().parent
CONFIG_GROUPS = sorted(d.name for d in (HERE / "configs").iterdir() if d.is_dir())

setup(
    packages=(find_packages(include=["minidist", "minidist.*"])
              + find_namespace_packages(include=["hydra_plugins.minidist_launcher"])
              + ["minidist.configs"] + [f"minidist.configs.{g}" for g in CONFIG_GROUPS]),
    package_dir={"minidist.configs": "configs"},
    package_data={"minidist.configs": ["*.yaml"], **{f"minidist.configs.{g}": ["*.yaml"] for g in CONFIG_GROUPS}},
)
