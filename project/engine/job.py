"""One training job from its launch to its end: each early end (SIGTERM, Ctrl-C, a rank or a DataLoader worker lost
or silent) reported in one line that says how to resume, and nothing of the job left for the next job of a sweep."""

import gc
import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.engine.checkpoints import checkpoint_step, remove_half_written
from project.engine.ddp import TIMEOUT_KEY, HydraJobLauncher, HydraJobRanks, silent_ranks
from project.engine.errors import (
    RunStopped,
    UserError,
    collective_timed_out,
    find_user_error,
    in_sweep_job,
    loader_timed_out,
    lost_a_loader_worker,
    lost_another_rank,
)
from project.engine.startup import RUN_AGAIN, arm, disarm, stop_on_sigterm
from project.engine.sweeps import continue_hint
from project.engine.upstream import is_spawn_launcher

# What a SIGTERM does to ddp_spawn's processes, which cannot agree on a step to stop at with a process that only waits.
SPAWNED_RANKS_ENDED = "the ddp_spawn processes were ended at once, not after a step"
# When a SIGTERM that Lightning did not handle came, once training had started.
AFTER_TRAINING = "after training, before the run's results were written"
# What a launch may change in this process's environment: restored when the job ends.
JOB_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "OMP_NUM_THREADS")


def resume_hint(trainer: L.Trainer) -> str:
    """How to carry on from the run's `last.ckpt` (an epoch's end, or inside one), if it wrote one; for a sweep's
    job, how to carry the sweep on (`project.engine.sweeps`)."""
    lasts = [Path(callback.dirpath or "") / "last.ckpt" for callback in trainer.checkpoint_callbacks]
    last = next((path for path in lasts if path.exists()), None)  # a file, or a sharded checkpoint's directory
    step = None if last is None else checkpoint_step(last)
    if in_sweep_job():
        this_job = "this job runs again" if last is None else f"this job resumes from its last checkpoint (step {step})"
        return f"{continue_hint()}; {this_job}"
    if last is None:
        return "it had written no checkpoint yet: run it again"
    path = last.parent.resolve() / last.name  # not a sharded checkpoint's link resolved: its target is replaced
    return f"resume from its last checkpoint (step {step}) with the same command plus ckpt_path={path}"


def spawned_ranks_ended(trainer: L.Trainer) -> str:
    """The line a SIGTERM ends ddp_spawn's launching process in, made once it has SIGKILLed the ranks: a checkpoint
    one was writing is removed half written, and the last whole one named."""
    remove_half_written(trainer)
    return f"stopped by SIGTERM: {SPAWNED_RANKS_ENDED}: {resume_hint(trainer)}"


def silence_line(error: Exception, silent: list[int], trainer: L.Trainer) -> str:
    """The one line for a collective that timed out: who went silent, for how long, and the key that sets the wait."""
    who = " and ".join(f"rank {rank}" for rank in silent) or "another rank"
    waited = re.search(r"waiting (\d+)ms", str(error))
    how_long = f" for {int(waited.group(1)) / 1000:g} s" if waited else ""
    return (
        f"{who} of the run did not answer{how_long} (stopped, hung, or far slower than the others): find out why, or "
        f"give it more time with {TIMEOUT_KEY}; then {resume_hint(trainer)}"
    )


def stop_if_signalled(trainer: L.Trainer) -> None:
    """End the run as SIGTERM does if it reached any rank and no loop stopped for it: the ranks agree on one between
    training steps only, so one in the last validation or the test is acted on here, between fit and test and after."""
    strategy = trainer.strategy
    if isinstance(strategy, HydraJobRanks) and dist.is_initialized() and strategy.sigterm_on_any_rank():
        raise SIGTERMException


def close_loggers(trainer: L.Trainer, failed: bool) -> None:
    """End every logger after the job's last write (its table of runs): one written to after Lightning ended it starts
    over, a writer thread per job of a sweep left running. A failed job's own error is reported, not a logger's."""
    for logger in trainer.loggers:
        try:
            logger.finalize("failed" if failed else "success")
        except Exception:
            if not failed:
                raise


@contextmanager
def isolated_job(trainer: L.Trainer) -> Iterator[None]:
    """Run one job's fit and test inside; afterwards nothing of it is left for the next job of a sweep."""
    saved_variables = {name: os.environ.get(name) for name in JOB_VARIABLES}
    saved_threads = torch.get_num_threads()
    launcher = trainer.strategy.launcher
    if is_spawn_launcher(launcher):  # ddp_spawn: Lightning handles SIGTERM in its processes alone
        stop_on_sigterm(lambda: spawned_ranks_ended(trainer))
    failed = True
    try:
        yield
        failed = False
    except SIGTERMException:  # Lightning's, after the step it was in: a SystemExit that would end with status 0
        line = f"stopped by SIGTERM in epoch {trainer.current_epoch}: {resume_hint(trainer)}"
        raise RunStopped(line, 128 + signal.SIGTERM, on_every_rank=True) from None
    except SystemExit as stop:  # Lightning's sys.exit(1) on Ctrl-C
        if not trainer.interrupted:
            raise
        line = f"interrupted by the user (Ctrl-C): {resume_hint(trainer)}"
        raise RunStopped(line, 128 + signal.SIGINT, on_every_rank=True) from stop
    except Exception as error:
        # Asked before the launcher ends its children, which may be the other ranks still there to answer.
        silent = silent_ranks() if collective_timed_out(error) else None
        if isinstance(launcher, HydraJobLauncher):
            # An error not of the user's may be a collective a dead child broke: give the child a moment to be reaped.
            launcher.note_dead_child(wait=0.0 if find_user_error(error) else 1.0)
            launcher.finish(failed=True)
            # The child's death is the line, unless rank 0 has a user error of its own or a rank went silent first.
            child_first = silent is None or launcher.failed_rank in silent
            if launcher.failure is not None and find_user_error(error) is None and child_first:
                raise UserError(launcher.failure) from error
        if silent is not None:
            raise RunStopped(silence_line(error, silent, trainer), 1) from error
        if lost_another_rank(error):
            first_line = str(error).strip().splitlines()[0]
            raise RunStopped(f"another rank of the run is gone ({first_line}); {resume_hint(trainer)}", 1) from error
        of = f" of {type(trainer.datamodule).__name__}" if trainer.datamodule is not None else ""
        if lost_a_loader_worker(error):
            line = f"a DataLoader worker{of} died (out of memory, or killed from outside): {resume_hint(trainer)}"
            raise RunStopped(line, 1) from error
        if loader_timed_out(error):
            seconds = str(error).split("after ", 1)[1].split()[0]
            raise RunStopped(
                f"a DataLoader worker{of} sent no batch within {seconds} s, its DataLoader's timeout (a hung or very "
                f"slow read): find out what it waits on, or give that DataLoader a longer timeout; then "
                f"{resume_hint(trainer)}",
                1,
            ) from error
        raise
    finally:
        disarm()
        close_loggers(trainer, failed)
        if isinstance(launcher, HydraJobLauncher):
            launcher.finish(failed)
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for name, value in saved_variables.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch.set_num_threads(saved_threads)


class FreeJobMemory(Callback):
    """After each job of a sweep: its trainer, module and data (cycles) are freed before the next job's tensors come
    on top, and Hydra's record of the job drops its two copies of the config; its return value stays."""

    def on_job_end(self, config: Any, job_return: JobReturn, **kwargs: Any) -> None:
        job_return.hydra_cfg = None
        job_return.cfg = None
        gc.collect()


class StartupStops(Callback):
    """A SIGTERM while a job starts stops it in one line (`project.engine.startup`), each job of a sweep too; the
    process that launches a sweep trains nothing itself, so it is not starting."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        disarm()

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        arm(continue_hint() if in_sweep_job() else RUN_AGAIN)


class TrainingStarts(L.Callback):
    """Ends the start-up as training starts (Lightning's SIGTERM handler, registered by now, stops at a step); after
    `fit`, where Lightning has none, a SIGTERM ends the job in one line naming the checkpoint to resume from."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stop_on_sigterm(lambda: f"stopped by SIGTERM {AFTER_TRAINING}: {resume_hint(trainer)}")
