"""hydra/launcher=minidist and hydra/sweeper=minidist, the defaults of minidist's configs/config.yaml.

Hydra's basic launcher and sweeper assume a job may write wherever it runs; under
torchrun every rank runs the same jobs, so only the main process may write, and
nothing may be written in a run directory before the run is validated. The logic is
in minidist.cli.jobs; this module registers the plugins and imports nothing heavy
(Hydra imports every module of hydra_plugins when it starts, in any Hydra app).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher


@dataclass
class MinidistLauncherConf:
    _target_: str = "hydra_plugins.minidist_launcher.minidist_launcher.MinidistLauncher"


@dataclass
class MinidistSweeperConf:
    _target_: str = "hydra_plugins.minidist_launcher.minidist_launcher.MinidistSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/launcher", name="minidist", node=MinidistLauncherConf, provider="minidist")
ConfigStore.instance().store(group="hydra/sweeper", name="minidist", node=MinidistSweeperConf, provider="minidist")


class MinidistLauncher(Launcher):
    """Every job in this process, in order, over the process group the recipe created; stops at a failure."""

    def __init__(self) -> None:
        super().__init__()
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> List[JobReturn]:
        from minidist.cli.jobs import launch
        return launch(self.hydra_context, self.config, self.task_function, job_overrides, initial_job_idx)


class MinidistSweeper(BasicSweeper):
    """Hydra's basic sweep (the cartesian product, in order); multirun.yaml and a summary from the main process."""

    def sweep(self, arguments: List[str]) -> Any:
        from minidist.cli.jobs import sweep
        return sweep(self, arguments)
