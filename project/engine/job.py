"""One training job from its launch to its end: what it leaves behind, and what its end is reported as.

A sweep runs many jobs in one process, so a job must give back what it took and what its launch changed: its
loggers are ended (their files and writer threads), its extra processes end (killed if it failed), its process group
is destroyed, and the environment variables and torch thread count a launch sets (Lightning reads LOCAL_RANK as
"processes were started for me", and lowers OMP_NUM_THREADS for DDP) are put back as they were; after the job, what
its trainer held is freed (`FreeJobMemory`).

A job that ends early is reported by what happened first, in one line (`project.engine.errors`):
- SIGTERM before its first epoch starts (imports, composing, DDP's ranks meeting, the data's setup): `project.engine.
  startup` stops the process, exit 143; `StartupStops` and `TrainingStarts` tell it when a job starts and trains.
  After `fit` (and `test`), where Lightning has no handler registered, it ends the job naming the checkpoint to
  resume from. Under ddp_spawn, whose processes this one only waits for, a SIGTERM at any time ends them and names
  what to resume.
- SIGTERM (what Slurm, Kubernetes and `timeout` send): Lightning stops after the step it is in and raises its
  `SIGTERMException`, a `SystemExit` that would end the process with status 0 (a mid-epoch checkpoint callback writes
  `last.ckpt` at that step); here it is a `RunStopped`, exit 143, naming the file to resume from.
- Ctrl-C: Lightning stops the run and calls `sys.exit(1)`; here it is a `RunStopped`, exit 130, naming it too.
- a DDP child that died first: rank 0's own error (a broken collective) is its consequence, so the child's death
  is the line reported, unless rank 0 has a user error of its own to report (the same one the child died of).
- another rank lost mid-run where a launcher started the ranks (torchrun, srun): the broken collective is one line
  here, exit 1; the launcher, which saw the rank end, names it.
- a rank that went silent (stopped, hung) for the whole `trainer.strategy.timeout`: the other ranks' collective
  times out, and each names the silent rank (`project.engine.ddp`) and the key that sets the wait, exit 1.
- a DataLoader worker process that died (killed, or out of memory): one line naming the data module and how to
  resume, exit 1.
- a DataLoader worker that sent no batch within its DataLoader's `timeout` (one the data module set): one line naming
  the data module and how to resume, exit 1.
"""

import gc
import os
import re
import signal
import traceback
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

from project.engine.checkpoints import checkpoint_step
from project.engine.ddp import TIMEOUT_KEY, HydraJobLauncher, HydraJobRanks, collective_timed_out, silent_ranks
from project.engine.errors import RunStopped, UserError, find_user_error, in_sweep_job
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
    last = next(
        (
            Path(callback.dirpath or "") / "last.ckpt"
            for callback in trainer.checkpoint_callbacks
            if (Path(callback.dirpath or "") / "last.ckpt").exists()  # a file, or a sharded checkpoint's directory
        ),
        None,
    )
    step = None if last is None else checkpoint_step(last)
    if in_sweep_job():
        this_job = "this job runs again" if last is None else f"this job resumes from its last checkpoint (step {step})"
        return f"{continue_hint()}; {this_job}"
    if last is None:
        return "it had written no checkpoint yet: run it again"
    path = last.parent.resolve() / last.name  # not a sharded checkpoint's link resolved: its target is replaced
    return f"resume from its last checkpoint (step {step}) with the same command plus ckpt_path={path}"


def lost_another_rank(error: Exception) -> bool:
    """Whether `error` is a collective that broke because another process of the run ended (gloo and NCCL say so)."""
    return (
        isinstance(error, RuntimeError)
        and dist.is_available()
        and dist.is_initialized()
        and ("remote worker" in str(error) or "remote process" in str(error))
    )


def lost_a_loader_worker(error: Exception) -> bool:
    """Whether `error` says that a DataLoader worker process died (killed, or out of memory): torch's report of it,
    or, where the worker died while handing over a batch through shared memory, the broken connection to it, raised
    from inside torch's DataLoader. Which of the two comes first is a matter of timing; the line is the same."""
    if isinstance(error, RuntimeError) and str(error).lstrip().startswith("DataLoader worker (pid"):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return isinstance(error, (EOFError, ConnectionError)) and any(
        frame.filename.endswith(os.path.join("torch", "utils", "data", "dataloader.py")) for frame in frames
    )


def loader_timed_out(error: Exception) -> bool:
    """Whether `error` is torch's report of a DataLoader worker that sent no batch within the DataLoader's `timeout`
    (0, torch's default, waits without end: a data module sets it)."""
    return isinstance(error, RuntimeError) and str(error).startswith("DataLoader timed out after")


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
    """End the run as SIGTERM does if it reached any rank and no loop has stopped for it yet.

    Under DDP and FSDP the ranks agree on a SIGTERM between training steps only (`HydraJobRanks`); one that came
    during the last validation or the test is acted on here, where every rank is: between fit and test, and after
    test.
    """
    strategy = trainer.strategy
    if isinstance(strategy, HydraJobRanks) and dist.is_initialized() and strategy.sigterm_on_any_rank():
        raise SIGTERMException


def close_loggers(trainer: L.Trainer, failed: bool) -> None:
    """End every logger of the job, as Lightning does at the end of `fit` and `test`, after the job's own last write
    (its hyperparameter table): a logger written to after Lightning ended it starts over (TensorBoard's opens a new
    event file with a writer thread of its own) and nothing would end it again, one thread per job of a sweep. Where
    the job failed, its own error is the one reported, not a logger's that could not end."""
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
        stop_on_sigterm(lambda: f"stopped by SIGTERM: {SPAWNED_RANKS_ENDED}: {resume_hint(trainer)}")
    failed = True
    try:
        yield
        failed = False
    except SIGTERMException:
        raise RunStopped(
            f"stopped by SIGTERM in epoch {trainer.current_epoch}: {resume_hint(trainer)}",
            128 + signal.SIGTERM,
            on_every_rank=True,
        ) from None
    except SystemExit as stop:
        if not trainer.interrupted:
            raise
        line = f"interrupted by the user (Ctrl-C): {resume_hint(trainer)}"
        raise RunStopped(line, 128 + signal.SIGINT, on_every_rank=True) from stop
    except Exception as error:
        # Asked before the launcher ends its children, which may be the other ranks still there to answer.
        silent = silent_ranks() if collective_timed_out(error) else None
        if isinstance(launcher, HydraJobLauncher):
            # Where this rank's error is not its own user error, it may be a child's death that broke a collective:
            # that child may take a moment to be reaped.
            launcher.note_dead_child(wait=0.0 if find_user_error(error) else 1.0)
            launcher.finish(failed=True)
            # Rank 0's own user error is first-hand (every rank checks its config and data alike); any other error
            # here is a broken collective, the consequence of the child's death, which is then the line. A child
            # that ended after a collective timed out, while another rank stayed silent, is a consequence too.
            child_first = silent is None or launcher.failed_rank in silent
            if launcher.failure is not None and find_user_error(error) is None and child_first:
                raise UserError(launcher.failure) from error
        if silent is not None:
            raise RunStopped(silence_line(error, silent, trainer), 1) from error
        if lost_another_rank(error):
            first_line = str(error).strip().splitlines()[0]
            raise RunStopped(f"another rank of the run is gone ({first_line}); {resume_hint(trainer)}", 1) from error
        data = getattr(trainer, "datamodule", None)
        of = f" of {type(data).__name__}" if data is not None else ""
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
    """After each job (Hydra calls it in the process that ran the job): what the job's trainer, module and data held
    is freed before the next job of a sweep starts, and the job's record keeps no copy of its config.

    A trainer and its module refer to each other, so they, and the weights, optimizer state and data they hold, are
    freed only by Python's cycle collector, which runs when it decides to: until then the next job's tensors (on a GPU
    too) come on top of them. Hydra's launcher keeps each job's record (`JobReturn`) until the sweep ends, and with
    it two copies of the job's config (with and without Hydra's part): some 150 kB a job, 150 MB over a thousand-job
    grid. Sweepers read a job's return value, which stays; the callbacks after this one in the config (called first)
    have seen the configs, and the job's directory keeps them (`.hydra/`).
    """

    def on_job_end(self, config: Any, job_return: JobReturn, **kwargs: Any) -> None:
        job_return.hydra_cfg = None
        job_return.cfg = None
        gc.collect()


class StartupStops(Callback):
    """A SIGTERM while a job starts stops it in one line (`project.engine.startup`), for each job of a sweep too; the
    process that launches a sweep trains nothing itself (its jobs do, here or on a cluster), so it is not starting."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        disarm()

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        arm(continue_hint() if in_sweep_job() else RUN_AGAIN)


class TrainingStarts(L.Callback):
    """Ends the start-up as training starts: Lightning's SIGTERM handler, registered by now, stops the run at a step
    while it trains (`isolated_job` reports it). Where Lightning has no handler registered, after `fit` (between it
    and `test`, after `test`), a SIGTERM ends the job in one line: resuming from the last checkpoint then trains
    nothing more, and tests and writes the results."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stop_on_sigterm(lambda: f"stopped by SIGTERM {AFTER_TRAINING}: {resume_hint(trainer)}")
