"""DDP whose extra processes re-run this Hydra *job*, not the command line, so `-m` sweeps stay correct.

Lightning's DDP starts ranks 1..N-1 by re-running `sys.argv` with `hydra.run.dir` appended. Under `-m` that argv
is the whole sweep: every child re-runs the sweep and joins the wrong job (or none), and `HydraConfig.run.dir` is
not the job's directory anyway. `HydraJobLauncher` starts each child as a single run of the current job instead:
the job's own overrides (one sweep point), `hydra.run.dir` = the job's output dir, no `.hydra/` copy.

It also makes a job leave nothing behind for the next one (`finish_job`): the children are waited for, the
process group is destroyed, and the variables the launcher exported (LOCAL_RANK, WORLD_SIZE, MASTER_PORT, ...)
are restored, since Lightning reads LOCAL_RANK as "processes were started for me" and would not launch the next
job's children. Children die with their parent (Linux PR_SET_PDEATHSIG), so a killed rank 0 leaves no orphans
stuck in a collective; a child that dies is named at once on stderr, and the run stops (rank 0 fails in its next
collective, or Lightning's observer kills it within 5 s).
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import lightning as L
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

import __main__

LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends SIGKILL when the parent process ends."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def child_command() -> list[str]:
    """The command that runs the current Hydra job once more, as a plain run in the same directory."""
    hydra = HydraConfig.get()
    job_overrides = [override for override in hydra.overrides.task if not override.startswith("hydra.")]
    run_dir = hydra.runtime.output_dir.replace('"', '\\"')
    return [
        sys.executable,
        "-m",
        __main__.__spec__.name,
        *job_overrides,
        f'hydra.run.dir="{run_dir}"',
        f"hydra.job.name={hydra.job.name}",
        "hydra.output_subdir=null",
    ]


class HydraJobLauncher(_SubprocessScriptLauncher):
    """Starts local ranks 1..N-1 as single runs of the current Hydra job (see the module docstring)."""

    def _call_children_scripts(self) -> None:
        self._check_can_spawn_children()
        self.procs = []
        self._saved_environment = {name: os.environ.get(name) for name in LAUNCHER_VARIABLES}
        os.environ.update(
            MASTER_ADDR=self.cluster_environment.main_address,
            MASTER_PORT=str(self.cluster_environment.main_port),
            NODE_RANK=str(self.cluster_environment.node_rank()),
            LOCAL_RANK="0",
            WORLD_SIZE=str(self.num_processes * self.num_nodes),
        )
        command = child_command()
        for local_rank in range(1, self.num_processes):
            environment = os.environ | {"LOCAL_RANK": str(local_rank)}
            child = subprocess.Popen(command, env=environment, cwd=get_original_cwd(), preexec_fn=_die_with_parent)
            self.procs.append(child)
        self._stopping = False
        threading.Thread(target=self._name_first_failure, daemon=True, name="first-failure").start()

    def _name_first_failure(self) -> None:
        """Beside training: print which rank ended badly first (gloo's own error names only an address)."""
        while not self._stopping and not self._report_failed_child():
            if all(child.returncode == 0 for child in self.procs):
                return
            time.sleep(0.2)

    def _report_failed_child(self) -> bool:
        """Print one line for the first child that has ended with an error; whether there was one."""
        first_rank = self.cluster_environment.node_rank() * self.num_processes
        for local_rank, child in enumerate(self.procs, start=1):
            code = child.poll()
            if code:
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                print(
                    f"error: rank {first_rank + local_rank} (pid {child.pid}) {how}: the run stops",
                    file=sys.stderr,
                    flush=True,
                )
                self._stopping = True
                return True
        return False

    def finish(self, failed: bool, timeout: float = 60.0) -> None:
        """End the children and restore the environment.

        After a success, wait for them (up to `timeout` s). After a failure here, first name a child that died (it
        is often the cause: its death broke rank 0's collective), then kill the others, which would otherwise sit
        in a collective until gloo's 30-minute timeout.
        """
        if failed and not self._stopping:
            deadline = time.monotonic() + 1.0  # let a dying child be reaped
            while not self._report_failed_child() and time.monotonic() < deadline:
                time.sleep(0.05)
        self._stopping = True
        for child in self.procs:
            if failed:
                child.kill()
            try:
                child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for name, value in getattr(self, "_saved_environment", {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class HydraDDPStrategy(DDPStrategy):
    """Lightning's DDP with `HydraJobLauncher` for the processes it starts itself."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if isinstance(self._launcher, _SubprocessScriptLauncher):
            self._launcher = HydraJobLauncher(self.cluster_environment, self.num_processes, self.num_nodes)


def finish_job(trainer: L.Trainer, failed: bool) -> None:
    """End this job's extra processes and process group, so the next job of a sweep starts clean."""
    launcher = trainer.strategy.launcher
    if isinstance(launcher, HydraJobLauncher):
        launcher.finish(failed)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
