"""One job of a side-by-side sweep, in a Python of its own: `python -m project.optional.parallel.worker`.

The launching process (`project.optional.parallel.side_by_side`) writes the job on this process's standard input,
pickled: the job's composed config, Hydra's callbacks and where the task function is defined (its module and name,
as pickle cannot carry a function `hydra.main` wrapped). It is this process's own parent that writes it, nothing
read from disk. The job then runs as Hydra's own launcher runs a job (`run_job`): the same callbacks, the same job
dir, `-m`'s mode, so it is a sweep's job in every way (its error.txt, its carrying on). What it returns goes back as
JSON on the descriptor the parent named (`RETURN_FD`); an end that must stop the whole sweep (a stop, an error every
job would meet) is this process's exit status, as it would be the sweep process's under Hydra's own launcher.
"""

import functools
import importlib
import importlib.util
import json
import logging
import math
import os
import pickle
import runpy
import sys
from collections.abc import Callable
from typing import Any

# The environment variable that names the descriptor this process writes its job's return value to.
RETURN_FD = "PROJECT_PARALLEL_RETURN_FD"
log = logging.getLogger("project.optional.parallel")


def task_function(module: str, name: str, path: str | None) -> Callable:
    """The function `hydra.main` decorated, found where it is defined (a script run by path: `path`).

    This process then stands in for that program (`python -m <module>`, `python <path>`): the ranks a job's DDP
    starts (`project.engine.ddp.child_command`) run the program, not this worker."""
    sys.argv[0] = path or module
    sys.modules["__main__"].__spec__ = None if path else importlib.util.find_spec(module)
    namespace = runpy.run_path(path, run_name="__parallel_main__") if path else vars(importlib.import_module(module))
    return namespace[name].__wrapped__


def announced(task: Callable, slot: str) -> Callable:
    """`task`, which first says in the job's log which devices and cores it was given and which it sees."""

    @functools.wraps(task)
    def job(cfg: Any) -> Any:
        import torch  # imported by the job's module already

        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        log.info(
            f"hydra/launcher=parallel gave this job {slot}: it sees CUDA_VISIBLE_DEVICES={seen}, cores {cores} "
            f"({torch.get_num_threads()} intra-op thread(s))"
        )
        return task(cfg)

    return job


def returned(value: Any) -> Any:
    """What the parent is sent of the task's return value: a number (a sweeper's objective) or None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def main() -> None:
    spec = pickle.load(sys.stdin.buffer)
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobRuntime, run_job, setup_globals

    setup_globals()
    config = spec["config"]
    HydraConfig.instance().set_config(config)
    JobRuntime.instance().set("name", config.hydra.job.name)
    task = announced(task_function(*spec["task"]), spec["slot"])
    answer = os.fdopen(int(os.environ[RETURN_FD]), "w")
    outcome = run_job(
        hydra_context=spec["hydra_context"],
        task_function=task,
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    try:
        json.dump({"value": returned(outcome.return_value)}, answer)
    except Exception as error:  # what the task raised past its own error handling: the parent fails the job with it
        json.dump({"error": f"{type(error).__name__}: {error}"}, answer)
    answer.close()


if __name__ == "__main__":
    main()
