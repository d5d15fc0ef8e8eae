"""`hydra/launcher=parallel`: the optional part `parallel`'s launcher, as Hydra finds it.

Hydra 1.3 takes launchers from the `hydra_plugins` package only, hence this file's place (Hydra 1.4 finds it by the
entry point pyproject.toml names). Hydra imports every plugin as it starts, so this file registers the config and
imports the launcher's work (`project.optional.parallel.side_by_side`) only when a sweep uses it.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class ParallelLauncherConf:
    """`hydra/launcher: parallel`: every key can be set per sweep (`hydra.launcher.jobs_at_once=2`)."""

    _target_: str = "hydra_plugins.parallel_launcher.parallel_launcher.ParallelLauncher"
    # GPUs each job is given (its CUDA_VISIBLE_DEVICES); on a machine without GPUs, CPU cores (its DDP ranks' cores).
    devices_per_job: int = 1
    # The GPUs the jobs share out, as CUDA_VISIBLE_DEVICES names them (`[0,1,2,3]`); null: every visible GPU.
    devices: Any = None
    # At most this many jobs at once; null: as many as there are slots (GPUs / devices_per_job, or cores on a CPU
    # machine). Jobs at once share the CPU cores equally, each its own.
    jobs_at_once: Any = None
    # Seconds a job stopped by Ctrl-C or SIGTERM gets to write its checkpoint and end before it is killed.
    stop_grace_s: int = 120


ConfigStore.instance().store(
    group="hydra/launcher", name="parallel", node=ParallelLauncherConf, provider="parallel_launcher"
)


class ParallelLauncher(Launcher):
    def __init__(self, devices_per_job: int, devices: Any, jobs_at_once: Any, stop_grace_s: int) -> None:
        self.devices_per_job, self.devices, self.jobs_at_once = devices_per_job, devices, jobs_at_once
        self.stop_grace_s = stop_grace_s
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from project.optional.parallel.side_by_side import launch

        return launch(self, [list(overrides) for overrides in job_overrides], initial_job_idx)
