"""`logger=wandb`: Lightning's WandbLogger, offline unless this machine is logged in, named after the run dir, and a
run that trains on when the W&B server cannot be reached.

Lightning's logger calls `wandb.init` as the first metric is logged, on rank 0 only (the other ranks get a dummy),
so a launch of any number of processes is one W&B run. What it leaves to its user, done here:
- online or offline: `wandb.init` asks for an API key where none is configured (a prompt at a terminal, an error in
  a batch job), so a machine that is not logged in logs offline, into the run dir, for `wandb sync` to upload later;
- a server that does not answer (or refuses the key): `wandb.init` raises, after `settings.init_timeout` seconds,
  which would end the run; here the run logs offline instead, said in one warning line;
- a sweep's jobs, which Hydra runs one after the other in one process: Lightning's logger reuses a W&B run still open
  in the process, so every job would log into the first one's; here each job's run is its own, in the sweep's group;
- a run's end: wandb finishes an open run as its service shuts down with the process, which a service shared by
  several processes (`wandb beta core`, WANDB_SERVICE) does not; here a run is finished as the process exits (or
  as Lightning reports its fit or test failed: marked failed), its records all written;
- the config as flat names (`model/optimizer/lr`), as TensorBoard's table and MLflow show it.
"""

import atexit
import functools
import logging
import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any, Literal

import wandb
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from wandb.errors import AuthenticationError, CommError

from project.engine.errors import in_sweep_job
from project.engine.reports import flat
from project.engine.run_dir import shown
from project.engine.run_log import report
from project.optional.wandb.login_state import logged_in


class WandbLogger(LightningWandbLogger):
    """One W&B run per run (rank 0's; a sweep job is a run), its files in `<save_dir>/wandb/`.

    `name` null: the run dir (`outputs/<date>/<time>`, `outputs/multirun/<date>/<time>/<job>`), relative to where it
    was started when it lies below. `group` null: a sweep's dir for its jobs, which then show as one group; none for
    single runs. `mode` null: WANDB_MODE where it is set, else `online` where wandb finds credentials here (`wandb
    login`, WANDB_API_KEY), else `offline`. The run dir is also the run's config key `run_dir`. `settings` are
    wandb's (`wandb.Settings`), `init_timeout` among them. `project` null: WANDB_PROJECT, else `lightning_logs`.
    """

    def __init__(
        self,
        run_dir: str,
        save_dir: str,
        project: str | None = None,
        name: str | None = None,
        group: str | None = None,
        mode: Literal["online", "offline", "disabled"] | None = None,
        log_model: Literal[True, False, "all"] = False,
        settings: dict[str, Any] | None = None,
    ) -> None:
        default_group = shown(Path(HydraConfig.get().sweep.dir)) if in_sweep_job() else None
        if mode is None and "WANDB_MODE" not in os.environ:  # wandb's own variable decides, where it is set
            mode = "online" if logged_in(wandb.Settings(**(settings or {}))) else "offline"
        super().__init__(
            name=name or shown(Path(run_dir)),
            save_dir=save_dir,
            project=project,
            log_model=log_model,
            group=group or default_group,
            mode=mode,
            settings=dict(settings or {}),
            config={"run_dir": str(Path(run_dir).resolve())},
        )
        # Lightning passes anonymous=None, which wandb 0.31 warns is a setting without effect.
        self._wandb_init.pop("anonymous")

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The W&B run, started at the first use: online or offline as `mode` says (see the class), and offline,
        said once, where the server fails to start it."""
        if self._experiment is not None or getattr(self, "_attach_id", None) is not None:
            return super().experiment  # this run's, or under ddp_spawn the one the launching process started
        if wandb.run is not None:  # the run of the previous job of this sweep, which ran in this process
            wandb.run.finish()
        # Global: the lines wandb prints before the run's own settings apply (the credentials it loaded) follow them.
        wandb.setup(wandb.Settings(**self._wandb_init["settings"]))
        try:
            run = super().experiment
        except (CommError, AuthenticationError) as error:
            reason = " ".join(str(error).splitlines()[0].split())[:200]
            self._wandb_init["mode"] = "offline"
            run = super().experiment
            report(
                f"warning: W&B: {run.settings.base_url} failed ({reason}); this run logs offline: "
                f"upload it later with `wandb sync {run.settings.sync_dir}`",
                sys.stderr,
                logging.WARNING,
            )
        else:
            where = run.url if run.settings.mode == "online" else f"offline in {run.settings.sync_dir}"
            report(f"W&B run {where}")
        finish_open_run_at_exit()
        return run

    def __getstate__(self) -> dict[str, Any]:
        """`trainer=ddp_spawn` pickles this logger for its processes, and Lightning starts the run here first for
        them to attach to: started through `experiment`, so that wandb is set up (silent) before Lightning's call
        of it warns."""
        if rank_zero_only.rank == 0:
            _ = self.experiment
        return super().__getstate__()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Lightning's end of a fit or test: where it failed, the run ends here, marked failed (exit code 1)."""
        super().finalize(status)
        if status == "failed" and self._experiment is not None:
            self._experiment.finish(exit_code=1)

    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        """`params` as flat names, `model/optimizer/lr`: W&B would show a nested config as `model.optimizer.lr`,
        which no other logger of the run uses."""
        super().log_hyperparams(flat(vars(params) if isinstance(params, Namespace) else dict(params)))


@functools.cache
def finish_open_run_at_exit() -> None:
    """Once per process, after the first `wandb.init` registered wandb's own exit hooks, so that this one runs
    before them: the run still open as the process exits is finished, its records written."""
    atexit.register(finish_open_run)


def finish_open_run() -> None:
    if wandb.run is not None:
        wandb.run.finish()
