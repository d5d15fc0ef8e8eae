"""`logger=mlflow`: Lightning's MLFlowLogger, named after the run and harmless when its tracking server goes away.

Lightning's logger raises on the first request that fails, and MLflow's HTTP client retries each request with
backoff for minutes first (7 retries, a 120 s timeout each): a tracking server lost mid-run would stall, then stop,
the training. Here the client gives up after `request_max_retries` retries of at most `request_timeout` seconds, and
the first failure ends this logger's logging with one warning: training, checkpoints and results go on as without it.
urllib3's own line per retry of an MLflow request is dropped: the retries end in that warning, or in nothing when one
of them got through.
"""

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import requests
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from mlflow.exceptions import MlflowException

from project.engine.errors import UserError, in_sweep_job
from project.engine.run_dir import shown
from project.engine.upstream import DropMessages

log = logging.getLogger(__name__)
# "Retrying (Retry(total=1, ...)) after connection broken by '...': /api/2.0/mlflow/runs/log-batch", a line per retry
# (urllib3/connectionpool.py, any version so far).
logging.getLogger("urllib3.connectionpool").addFilter(DropMessages([r"Retrying \(.*: /api/[\d.]+/mlflow"]))
LOCAL_STORE_PREFIX = "sqlite:///"


class MLFlowLogger(LightningMLFlowLogger):
    """One MLflow run per run (rank 0's; a sweep job is a run), in one experiment per sweep.

    `experiment_name` null: a sweep's dir (`outputs/multirun/<date>/<time>`) for its jobs, which then compare in one
    table; Hydra's job name (`train`) for single runs. `run_name` null: the job's subdir in the sweep dir (`0`, `1`,
    ...), or a single run's dir (`outputs/<date>/<time>`), relative to where it was started when it lies below. The
    run dir is also the run's tag `run_dir`.

    A local store (`sqlite:///<file>`) keeps artifacts in `mlartifacts/` beside its file, unless `artifact_location`
    says otherwise: MLflow would put them in `./mlruns`, outside outputs/. A server keeps them where it was told.

    `log_model: true` logs the best checkpoint (that of the checkpoint callback with a `monitor`), not `last.ckpt`.
    """

    def __init__(
        self,
        run_dir: str,
        tracking_uri: str,
        experiment_name: str | None = None,
        run_name: str | None = None,
        artifact_location: str | None = None,
        log_model: Literal[True, False, "all"] = False,
        request_max_retries: int = 2,
        request_backoff_factor: int = 1,
        request_timeout: int = 5,
        tags: dict[str, Any] | None = None,
    ) -> None:
        # Read by MLflow's HTTP client at every request: set before the first.
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(request_max_retries)
        os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = str(request_backoff_factor)
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(request_timeout)
        default_experiment, default_run = names_from_run_dir(Path(run_dir))
        if artifact_location is None and tracking_uri.startswith(LOCAL_STORE_PREFIX):
            store_file = Path(tracking_uri.removeprefix(LOCAL_STORE_PREFIX))
            store_file.parent.mkdir(parents=True, exist_ok=True)  # MLflow makes the file, not its directory
            artifact_location = str((store_file.parent / "mlartifacts").resolve())
        super().__init__(
            experiment_name=experiment_name or default_experiment,
            run_name=run_name or default_run,
            tracking_uri=tracking_uri,
            tags={"run_dir": str(Path(run_dir).resolve()), **(tags or {})},
            log_model=log_model,
            artifact_location=artifact_location,
        )
        self._lost = False

    @property
    def experiment(self) -> Any:
        """MLflow's client, once the experiment and run exist. A store that does not answer as the run starts (a
        server not started, a mistyped URI) ends the run in one line, before it trains: nothing is lost yet."""
        try:
            return super().experiment
        except (MlflowException, requests.RequestException) as error:
            reason = " ".join(str(error).split())[:200]
            raise UserError(
                f"logger.mlflow.tracking_uri={self._tracking_uri} does not answer ({reason}): start the MLflow server "
                "there, or point the key at one (without it the run logs to outputs/mlflow.db)"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        """The copy that `trainer=ddp_spawn` sends to its processes logs into this run, made here first if need be:
        each copy would otherwise start a run of its own (one for fit, one for test, besides this process's)."""
        if rank_zero_only.rank == 0:
            self._keep_going(lambda: self.experiment)
        return self.__dict__.copy()

    def _keep_going(self, action: Callable[..., Any], *args: Any) -> Any:
        """`action(*args)`, or None once a request to the tracking store has failed (said once, as a warning)."""
        if self._lost:
            return None
        try:
            return action(*args)
        except (MlflowException, requests.RequestException) as error:
            self._lost = True
            reason = " ".join(str(error).split())[:200]
            log.warning(f"MLflow: {self._tracking_uri} failed; no more logging there, training goes on: {reason}")
            return None

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self._keep_going(super().log_hyperparams, params)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._keep_going(super().log_metrics, metrics, step)

    def finalize(self, status: str = "success") -> None:
        self._keep_going(super().finalize, status)

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        if checkpoint_callback.monitor is not None:
            self._keep_going(super().after_save_checkpoint, checkpoint_callback)

    @property
    def name(self) -> str | None:
        return self._keep_going(lambda: super(MLFlowLogger, self).name)

    @property
    def version(self) -> str | None:
        """The run id, which the progress bar shows; None once the store has failed."""
        return self._keep_going(lambda: super(MLFlowLogger, self).version)


def names_from_run_dir(run_dir: Path) -> tuple[str, str]:
    """(experiment name, run name) of the run in `run_dir`: see `MLFlowLogger`."""
    if in_sweep_job():
        sweep_dir = Path(HydraConfig.get().sweep.dir)
        return shown(sweep_dir), str(run_dir.resolve().relative_to(sweep_dir.resolve()))
    experiment = HydraConfig.get().job.name if HydraConfig.initialized() else "train"
    return experiment, shown(run_dir)
