"""The jobs of one slot of a side-by-side sweep, one after another, in a Python of their own:
`python -m project.optional.parallel.worker`.

The launching process (`project.optional.parallel.side_by_side`) writes each job on this process's standard input,
pickled: its composed config, Hydra's callbacks, where the task function is defined (its module and name, as pickle
cannot carry a function `hydra.main` wrapped) and the file its console output goes to. It is this process's own
parent that writes them, nothing read from disk. Each job runs as Hydra's own launcher runs a job (`run_job`): the
same callbacks, the same job dir, `-m`'s mode, so it is a sweep's job in every way (its error.txt, its carrying on);
and one job after another in one process, as Hydra's own launcher runs them, each giving back what it took
(`project.engine.job`), so that only the slot's first job pays the imports. The launcher started this process on
the slot's cores, without OMP_NUM_THREADS or MKL_NUM_THREADS, so torch sized its threads by those cores as it was
imported (a job's DDP ranks divide them: Lightning gives each rank cores ÷ ranks intra-op threads). What a job
returns goes back as one JSON line on the descriptor the parent named (`RETURN_FD`); an end that must stop the whole
sweep (a stop, an error every job would meet) is this process's exit status, as it would be the sweep process's
under Hydra's own launcher. Standard input's end (the sweep has no more jobs for this slot) ends the process.
"""

import functools
import importlib
import importlib.util
import json
import logging
import os
import pickle
import re
import runpy
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf

from project.engine.errors import exit_on_user_error
from project.engine.sweeps import is_number
from project.optional.parallel.slots import Slot, check_job_fits

# The environment variables that name the descriptor this process writes its jobs' return values to, and its
# launcher's pid.
RETURN_FD, LAUNCHER = "PROJECT_PARALLEL_RETURN_FD", "PROJECT_PARALLEL_LAUNCHER"
PR_SET_PDEATHSIG = 1
log = logging.getLogger("project.optional.parallel")


@functools.cache
def task_function(module: str, name: str, path: str | None) -> Callable:
    """The function `hydra.main` decorated, found where it is defined (a script run by path: `path`).

    This process then stands in for that program (`python -m <module>`, `python <path>`): the ranks a job's DDP
    starts (`project.engine.ddp.child_command`) run the program, not this worker."""
    sys.argv[0] = path or module
    sys.modules["__main__"].__spec__ = None if path else importlib.util.find_spec(module)
    namespace = runpy.run_path(path, run_name="__parallel_main__") if path else vars(importlib.import_module(module))
    return namespace[name].__wrapped__


def openmp_threads() -> str:
    """OpenMP's own count (`omp_get_max_threads` of the OpenMP torch loaded, for this thread's parallel regions), as
    torch reports it; "no" where torch was built without OpenMP."""
    found = re.search(r"omp_get_max_threads\(\) : (\d+)", torch.__config__.parallel_info())
    return found.group(1) if found else "no"


@exit_on_user_error  # a job's error: it fails alone, its line in its error.txt and the sweep's table
def fits(slot: Slot, cfg: Any) -> bool:
    check_job_fits(slot, OmegaConf.select(cfg, "trainer.devices"))
    return True


def announced(task: Callable, slot: Slot) -> Callable:
    """`task`, which first says in the job's log which devices and cores it was given, which it sees and the threads
    it has on them; a job that asks for more devices than its slot has ends there, refused in one line."""

    @functools.wraps(task)
    def job(cfg: Any) -> Any:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        log.info(
            f"hydra/launcher=parallel gave this job {slot.describe()}: it sees CUDA_VISIBLE_DEVICES={seen}, cores "
            f"{cores}: {torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op, "
            f"{openmp_threads()} OpenMP thread(s)"
        )
        return task(cfg) if fits(slot, cfg) else None

    return job


def returned(value: Any) -> Any:
    """What the parent is sent of the task's return value: a number (a sweeper's objective) or None."""
    return value if is_number(value) else None


def console_to(path: str) -> None:
    """From here on, this process's standard output and error (its libraries' too) go to the job's console file."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(path, "ab") as console:
        os.dup2(console.fileno(), 1)
        os.dup2(console.fileno(), 2)


def die_with_launcher() -> None:
    """Be sent SIGTERM as the launcher ends, however it ends (Linux); a launcher gone already ends this process."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    try:  # asked after the prctl: a launcher that ended before it sent no SIGTERM
        os.kill(int(os.environ.pop(LAUNCHER)), 0)
    except ProcessLookupError:
        sys.exit(1)


def run(spec: dict) -> dict:
    """Run one job; its answer for the parent."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobRuntime, run_job, setup_globals

    console_to(spec["console"])
    setup_globals()
    config = spec["config"]
    HydraConfig.instance().set_config(config)
    JobRuntime.instance().set("name", config.hydra.job.name)
    outcome = run_job(
        hydra_context=spec["hydra_context"],
        task_function=announced(task_function(*spec["task"]), spec["slot"]),
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    try:
        return {"value": returned(outcome.return_value)}
    except Exception as error:  # what the task raised past its own error handling: the parent fails the job with it
        traceback.print_exception(error)  # into the job's console.log (Hydra 1.3 prints only the job's overrides)
        return {"error": f"{type(error).__name__}: {error}"}


def main() -> None:
    die_with_launcher()
    with os.fdopen(int(os.environ.pop(RETURN_FD)), "w", buffering=1) as answers:
        while True:
            try:
                spec = pickle.load(sys.stdin.buffer)
            except EOFError:
                return
            answers.write(json.dumps(run(spec)) + "\n")


if __name__ == "__main__":
    main()
