"""`hydra/sweeper=optuna`: the optional part `optuna`'s sweeper, as Hydra finds it.

Hydra 1.3 takes sweepers from the `hydra_plugins` package only, hence this file's place (Hydra 1.4 finds it by the
entry point pyproject.toml names). Hydra imports every plugin as it starts, so this file registers the config that
conf/hparams_search/mnist_optuna.yaml overrides and imports the search (`project.optional.optuna.search`, and with it
Optuna and SQLAlchemy) only when a sweep uses it.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import MISSING, DictConfig


@dataclass
class ResumableOptunaSweeperConf:
    """`hydra/sweeper: optuna`: the keys conf/hparams_search/mnist_optuna.yaml sets."""

    _target_: str = "hydra_plugins.resumable_optuna_sweeper.resumable_optuna_sweeper.ResumableOptunaSweeper"
    # The study's storage URL (sqlite:///${hydra.sweep.dir}/optuna.db, journal://<file>): the trials' jobs reach it
    # too (pruning), wherever they run. No default: OmegaConf resolves a default's ${...} as a config is merged over
    # it, which would claim a sweep dir of its own.
    storage: str = MISSING
    study_name: str = MISSING
    n_trials: int = 20
    n_jobs: int = 1
    # Seconds between the heartbeats of a running trial, and without one after which its worker is taken for gone.
    heartbeat_interval: int = 10
    grace_period: int = 60
    # `_target_` + arguments of an Optuna sampler; none: Optuna's default (TPE, unseeded).
    sampler: Any = None
    # `_target_` + arguments of an Optuna pruner; none: every trial runs to its end.
    pruner: Any = None
    params: Any = None
    # Not needed: the search follows optimized_mode. Read only so that a config written for Hydra's Optuna sweeper
    # still runs where it agrees (and is refused where it does not).
    direction: Any = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="optuna", node=ResumableOptunaSweeperConf, provider="resumable_optuna_sweeper"
)


class ResumableOptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        """`settings`: ResumableOptunaSweeperConf's keys, as Hydra gives them (`OptunaSearch` builds them)."""
        self.settings = settings
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def sweep(self, arguments: list[str]) -> None:
        from project.optional.optuna.search import OptunaSearch

        search = OptunaSearch(**self.settings)
        search.setup(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        search.sweep(arguments)
