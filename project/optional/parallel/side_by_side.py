"""The launching side of `hydra/launcher=parallel`: a sweep's jobs started side by side, one per free slot.

Each slot has a worker, a Python of its own (`project.optional.parallel.worker`) started in a new session with the
slot's GPUs as its CUDA_VISIBLE_DEVICES and the slot's cores as its CPU affinity from its first instruction, so that
its jobs see and use those alone, and their DDP ranks and DataLoader workers with them; torch sizes its thread pools
by that affinity as the worker imports it (`start_worker`). A worker runs its slot's jobs one after another, as
Hydra's own launcher runs a sweep's, so only a slot's first job pays the imports. A job's console output goes to
`console.log` in its job dir (its `train.log` holds what it reports, as any run's). A slot takes its next job as its
job ends, however it ends:
- a job that fails (its error line, error.txt) fails alone, as under Hydra's own launcher; so does one whose worker
  was killed (out of memory): the launcher writes its error.txt, and the slot's next job starts a new worker;
- a job that ends in a way every job would meet (a stop, `UserError.ends_the_sweep`) ends the sweep, as it would the
  sweep's process under Hydra's own launcher: the other jobs are stopped (SIGTERM: each writes its checkpoint) and
  the launcher exits with that job's line and status;
- Ctrl-C or SIGTERM to the launching process is passed on once to every running job's process group (the workers
  run in sessions of their own, so a terminal's Ctrl-C reaches them through here only, once); each job stops at a
  step as a run does, and the sweep ends with the line that carries it on (exit 130 or 143). A job that has not
  ended `stop_grace_s` later, or when the signal comes again, is killed with all its processes. A worker outlives
  no launcher: it is sent SIGTERM as its launcher's process ends, however that ends (Linux's PR_SET_PDEATHSIG).
"""

import contextlib
import dataclasses
import functools
import json
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from project.engine.errors import ERROR_FILE, UserError, refuse
from project.engine.reports import format_results_table, format_value
from project.engine.run_log import report
from project.engine.sweeps import continue_hint, finished_results
from project.optional.parallel.slots import Slot, plan_slots, visible_gpus
from project.optional.parallel.worker import LAUNCHER, RETURN_FD

log = logging.getLogger(__name__)
# The job's console output, in its job dir.
CONSOLE_FILE = "console.log"
# How long the launcher waits for an answer before it looks again at the workers and at a stop's deadline.
POLL_SECONDS = 0.2
STOPS = {signal.SIGINT: "interrupted by the user (Ctrl-C)", signal.SIGTERM: "stopped by SIGTERM"}
# The variables that would size every job's threads alike whatever its slot (a cluster's shell often sets them): a
# worker goes without, so that torch counts the cores of its slot, and Lightning divides them among a job's DDP ranks.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class Job:
    number: int
    overrides: list[str]
    directory: Path
    started: float


@dataclass
class Worker:
    """A slot's Python, and the job it runs (None: idle)."""

    slot: Slot
    process: subprocess.Popen
    answers: int  # the read end of the pipe its jobs' answers come back on, one JSON line each
    received: bytes = b""
    answers_ended: bool = False  # its pipe's end read: nothing more will come
    job: Job | None = None
    signalled: int = 0  # the stop's signal, once passed on to its job


@dataclass
class SweepStop:
    """Why the sweep is ending before its last job: a signal to the launcher, or a job that ended the sweep; the
    launcher's loop passes `signal` on to every running job (SIGKILL once `deadline` has passed)."""

    status: int
    line: str
    signal: int
    deadline: float


def task_location(task: Any) -> tuple[str, str, str | None]:
    """Where a new Python finds `task`: its module's name and the name `hydra.main`'s function has there, or the
    file of a script run by path."""
    module = sys.modules.get(task.__module__)
    if getattr(getattr(module, task.__name__, None), "__wrapped__", None) is not task:
        raise UserError(
            f"hydra/launcher=parallel starts each job in a new Python, which finds the job's function by its module "
            f"and name, and {task.__module__}.{task.__name__} is not the @hydra.main function there: define it at "
            "the top level of its module, or run this sweep with Hydra's own launcher (hydra/launcher=basic)"
        )
    if task.__module__ != "__main__":
        return task.__module__, task.__name__, None
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.name:  # python -m package.module
        return spec.name, task.__name__, None
    return "", task.__name__, os.path.abspath(module.__file__)


def job_config(launcher: Any, overrides: list[str], number: int) -> DictConfig:
    """The job's composed config, as Hydra's own launcher composes it, with its dir resolved here: a resolver that
    names a dir (`${now:...}`) would name another in the worker."""
    config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(config):
        config.hydra.job.id = str(number)  # a str in Hydra's schema
        config.hydra.job.num = number
        config.hydra.sweep.dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
        config.hydra.sweep.subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    return config


def start_worker(slot: Slot) -> Worker:
    """The slot's worker, on the slot's cores before its first instruction: its first import (the `project`
    package) imports torch, which sizes its intra-op, inter-op, OpenMP and MKL threads by the cores the process may
    run on, once; an affinity set by the worker itself would come after."""
    answers, answer_end = os.pipe()
    environment = os.environ | {RETURN_FD: str(answer_end), LAUNCHER: str(os.getpid())}
    for name in ("MASTER_PORT", *THREAD_VARIABLES):  # MASTER_PORT: each job's DDP holds a port of its own
        environment.pop(name, None)
    if slot.gpus:
        environment["CUDA_VISIBLE_DEVICES"] = ",".join(slot.gpus)
    process = subprocess.Popen(
        [sys.executable, "-m", "project.optional.parallel.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,  # each job sends its own to its console.log
        env=environment,
        pass_fds=(answer_end,),
        start_new_session=True,
        preexec_fn=functools.partial(os.sched_setaffinity, 0, slot.cores),
    )
    os.close(answer_end)
    os.set_blocking(answers, False)
    return Worker(slot, process, answers)


def job_context(launcher: Any) -> Any:
    """What a worker needs of Hydra's context: its callbacks (a job composes nothing, so no config loader)."""
    return dataclasses.replace(launcher.hydra_context, config_loader=None)


def hand_over(worker: Worker, launcher: Any, task: tuple, overrides: list[str], number: int) -> None:
    """Give `worker` the job: its spec on the worker's standard input, from a thread (a spec is larger than a pipe
    holds, and a new worker reads it only once its Python has started)."""
    config = job_config(launcher, overrides, number)
    directory = Path(config.hydra.sweep.dir, config.hydra.sweep.subdir)
    directory.mkdir(parents=True, exist_ok=True)
    spec = {
        "config": config,
        "hydra_context": job_context(launcher),
        "task": task,
        "slot": worker.slot,
        "console": str(directory / CONSOLE_FILE),
    }
    payload = pickle.dumps(spec)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError):  # a worker that died: its end is read from its exit status
            worker.process.stdin.write(payload)
            worker.process.stdin.flush()

    worker.job = Job(number, list(overrides), directory, time.monotonic())
    threading.Thread(target=write, daemon=True).start()
    report(f"job {number} started in {worker.slot.describe()}: {' '.join(filter_overrides(overrides)) or '-'}")


def signal_group(worker: Worker, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(worker.process.pid, number)


def last_error_line(job: Job) -> str | None:
    console = job.directory / CONSOLE_FILE
    lines = console.read_text(errors="replace").splitlines() if console.is_file() else []
    return next((line for line in reversed(lines) if line.startswith("error: ")), None)


def answered(job: Job, answer: dict, metric: str) -> JobReturn:
    """The return of a job its worker answered for: it ran to its end, failed or not."""
    outcome = JobReturn(overrides=job.overrides, working_dir=os.getcwd(), status=JobStatus.COMPLETED)
    if "error" in answer:
        outcome.status, outcome.return_value = JobStatus.FAILED, RuntimeError(answer["error"])
    else:
        outcome.return_value = answer["value"]
    error_file = job.directory / ERROR_FILE
    error = error_file.read_text().strip() if error_file.is_file() else answer.get("error")
    what = f"failed: {error.removeprefix('error: ')}" if error else f"{metric} {format_value(answer['value'])}"
    report(f"job {job.number} ended after {time.monotonic() - job.started:.0f} s: {what}")
    results = None if error else finished_results(job.directory)
    if results is not None:  # the table the job printed in its console.log, as one at a time shows it
        report(format_results_table(results))
    return outcome


def worker_gone(job: Job, status: int, stop: SweepStop | None) -> tuple[JobReturn, SweepStop | None]:
    """The return of a job whose worker ended without answering; a stop, where its end ends the sweep."""
    outcome = JobReturn(overrides=job.overrides, working_dir=os.getcwd(), status=JobStatus.COMPLETED)
    elapsed = f"{time.monotonic() - job.started:.0f} s"
    if status < 0 and stop is None:  # killed by a signal no stop sent (the kernel's, a crash): this job alone fails
        name = signal.Signals(-status).name
        why = " (out of memory, or from outside)" if -status == signal.SIGKILL else ""
        line = f"error: the job's process was killed by {name}{why}: see {CONSOLE_FILE} in its dir"
        (job.directory / ERROR_FILE).write_text(line + "\n")
        report(f"job {job.number} {line}", sys.stderr)
        return outcome, None
    own = last_error_line(job) or ""
    if stop is not None:  # "...: carry the sweep on ...; this job resumes from its last checkpoint (step N)"
        report(f"job {job.number} stopped after {elapsed}" + (f": {own.rsplit('; ', 1)[-1]}" if "; " in own else ""))
        return outcome, None
    report(f"job {job.number} ended the sweep after {elapsed}")
    line = own or f"error: job {job.number} ended with status {status}: see {CONSOLE_FILE} in its dir"
    return outcome, SweepStop(status or 1, line, signal.SIGTERM, deadline=0.0)  # the launcher sets the deadline


def checked_settings(launcher: Any) -> tuple[list[Slot], tuple]:
    """The slots and where the workers find the task function, or one line saying what cannot be."""
    devices, grace = launcher.devices, launcher.stop_grace_s
    if devices is not None and not isinstance(devices, Sequence) or isinstance(devices, str):
        raise UserError(
            f"hydra.launcher.devices must be a list of GPUs ('hydra.launcher.devices=[0,1]'), got {devices!r}"
        )
    if not (isinstance(grace, (int, float)) and not isinstance(grace, bool) and grace >= 0):
        raise UserError(f"hydra.launcher.stop_grace_s must be a number of seconds >= 0, got {grace!r}")
    gpus = [str(gpu) for gpu in devices] if devices is not None else visible_gpus()
    slots = plan_slots(gpus, sorted(os.sched_getaffinity(0)), launcher.devices_per_job, launcher.jobs_at_once)
    task = task_location(launcher.task_function)
    try:
        pickle.dumps((job_context(launcher), task))
    except Exception as error:
        raise UserError(
            f"hydra/launcher=parallel sends each job's Hydra callbacks to its worker, and one cannot be pickled "
            f"({type(error).__name__}: {error}): drop it from hydra.callbacks, or use hydra/launcher=basic"
        ) from None
    return slots, task


def launch(launcher: Any, job_overrides: list[list[str]], initial_job_idx: int) -> list[JobReturn]:
    """Run the jobs, one per slot at once; their returns in job order (the module docstring says how they end)."""
    setup_globals()
    HydraConfig.instance().set_config(launcher.config)  # the sweep's, for the line that carries it on
    try:
        slots, task = checked_settings(launcher)
    except UserError as error:
        refuse(str(error))
    metric = launcher.config.optimized_metric
    waiting = deque(enumerate(job_overrides, start=initial_job_idx))
    free: deque[Slot] = deque(slots[: len(job_overrides)])
    workers: list[Worker] = []
    returns: dict[int, JobReturn] = {}
    stop: SweepStop | None = None
    log.info(f"Launching {len(job_overrides)} jobs, {min(len(slots), len(job_overrides))} at once")

    def on_signal(number: int, frame: Any) -> None:
        """Only notes the stop: the loop passes it on, to every job running then or handed over since."""
        nonlocal stop
        if stop is None:
            line = f"error: {STOPS[signal.Signals(number)]}: {continue_hint()}"
            stop = SweepStop(128 + number, line, number, time.monotonic() + launcher.stop_grace_s)
        else:  # a second time: at once
            stop.deadline = 0.0

    def ready_worker() -> Worker | None:
        """An idle worker, or a new one on a free slot; None while every slot has a job."""
        idle = next((worker for worker in workers if worker.job is None), None)
        if idle is None and free:
            idle = start_worker(free.popleft())
            workers.append(idle)
        return idle

    def pass_on(stop: SweepStop) -> None:
        wanted = signal.SIGKILL if time.monotonic() > stop.deadline else stop.signal
        for worker in workers:
            if worker.job is not None and worker.signalled != wanted:
                signal_group(worker, wanted)
                worker.signalled = wanted

    previous = {number: signal.signal(number, on_signal) for number in STOPS}
    try:
        while any(worker.job for worker in workers) or (waiting and stop is None):
            while waiting and stop is None and (worker := ready_worker()) is not None:
                number, overrides = waiting.popleft()
                hand_over(worker, launcher, task, overrides, number)
            if stop is not None:
                pass_on(stop)
            busy = [worker for worker in workers if worker.job is not None]
            listening = [worker.answers for worker in busy if not worker.answers_ended]
            readable, _, _ = select.select(listening, [], [], POLL_SECONDS)
            for worker in busy:
                ended = worker.process.poll() is not None  # asked first: what it sent before it ended is read below
                if worker.answers in readable or ended:
                    read_answers(worker)
                if b"\n" in worker.received:
                    line, worker.received = worker.received.split(b"\n", 1)
                    returns[worker.job.number] = answered(worker.job, json.loads(line), metric)
                    worker.job, worker.signalled = None, 0
                elif ended:
                    returns[worker.job.number], ends = worker_gone(worker.job, worker.process.returncode, stop)
                    retire(worker)
                    workers.remove(worker)
                    free.append(worker.slot)
                    if ends is not None and stop is None:
                        stop = dataclasses.replace(ends, deadline=time.monotonic() + launcher.stop_grace_s)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for worker in workers:  # idle by now, unless this loop failed: then its job is stopped first
            if worker.job is not None:
                signal_group(worker, signal.SIGTERM)
            retire(worker, wait=launcher.stop_grace_s)
    if stop is not None:
        report(stop.line, sys.stderr)
        sys.exit(stop.status)
    return [returns[number] for number in sorted(returns)]


def read_answers(worker: Worker) -> None:
    """What the worker has sent (its pipe never blocks the launcher: a process the job forked may hold it open)."""
    with contextlib.suppress(BlockingIOError):
        while not worker.answers_ended:
            chunk = os.read(worker.answers, 1 << 16)
            worker.received += chunk
            worker.answers_ended = not chunk


def retire(worker: Worker, wait: float = 0.0) -> None:
    """End the worker (the end of its input ends an idle one; `wait` seconds later, or at once for one that ended
    already, whatever is left of its processes is killed) and close its pipes."""
    with contextlib.suppress(BrokenPipeError):
        worker.process.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.process.wait(timeout=wait)
    signal_group(worker, signal.SIGKILL)  # its processes that outlived it (a DDP rank, a DataLoader worker)
    worker.process.wait()
    os.close(worker.answers)
