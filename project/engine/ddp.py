"""The processes of a multi-process run: started as one Hydra job (`HydraJobLauncher`, `HydraDDPStrategy`), meeting,
agreeing on their config and on SIGTERM (`DeferredAgreement`), every wait on each other ending in one line, and
sharing out the samples they evaluate with none counted twice (`evaluated_once`)."""

import ctypes
import inspect
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd, to_absolute_path
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
from omegaconf import OmegaConf
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

import __main__
from project.engine.config import command_line_overrides, config_source_arguments, run_config_of
from project.engine.errors import UserError
from project.engine.upstream import (
    OwnScriptLauncher,
    ScriptLauncher,
    flag_sigterm,
    replace_sigterm_notifier,
    set_num_threads_if_needed,
    skip_lightning_sigterm_broadcast,
    strategy_timeout,
    with_sampler,
)

log = logging.getLogger(__name__)
# The config key that sets how long a rank waits for the others (conf/trainer/ddp.yaml, slurm.yaml, ddp_spawn.yaml).
TIMEOUT_KEY = "trainer.strategy.timeout.seconds"
# How long the ranks that timed out wait for each other to say so (their timers end within moments of each other).
ROLL_CALL_SECONDS = 3.0
# Hydra overrides the child command sets itself (each may appear once).
CHILD_HYDRA_KEYS = ("hydra.mode", "hydra.run.dir", "hydra.job.name", "hydra.output_subdir")
PR_SET_PDEATHSIG = 1
# After naming a dead child, how long rank 0 gets to fail on its own (its next collective) before the process ends.
STOP_GRACE_SECONDS = 30.0


def reserved_port() -> socket.socket:
    """A socket bound to a free port of this machine (`getsockname()[1]`), never listening: while it is open nothing
    else here takes that port, yet a server that binds it with SO_REUSEADDR (torch's TCPStore) still can."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("", 0))
    return holder


def port_in_use(error: BaseException) -> int | None:
    """The port of torch's "address already in use" (a store served where another program listens), if `error` is it."""
    if not isinstance(error, dist.DistNetworkError) or "EADDRINUSE" not in str(error):
        return None
    found = re.search(r"port: (\d+)", str(error))
    return int(found.group(1)) if found else None


def answers_as_store(host: str, port: int, seconds: float) -> bool | None:
    """Whether what listens at host:port answers as torch's store within `seconds`; None when nothing listens there
    yet. Asked from a thread that is given up on: against another program torch's client waits without end."""
    try:
        socket.create_connection((host, port), timeout=seconds).close()
    except OSError:
        return None
    asked, answered = threading.Event(), threading.Event()

    def ask() -> None:
        try:
            dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=seconds)).check(["project/probe"])
            answered.set()
        except RuntimeError:  # it answered, but not as a store does
            pass
        finally:
            asked.set()

    threading.Thread(target=ask, daemon=True, name="store-probe").start()
    return asked.wait(seconds) and answered.is_set()


def silent_ranks(seconds: float = ROLL_CALL_SECONDS) -> list[int]:
    """The ranks that do not mark themselves present in the run's store within `seconds`; every rank whose collective
    timed out calls this at about the same moment. A store that does not answer is rank 0's, so rank 0 is silent."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    prefix = f"project/present/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    present: list[int] = []

    def roll_call() -> None:
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        try:
            store = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=seconds))
            store.set(f"{prefix}{rank}", "")
            time.sleep(seconds)
            present.extend(other for other in range(world_size) if store.check([f"{prefix}{other}"]))
        except RuntimeError:  # the store is gone: its process ended
            pass

    caller = threading.Thread(target=roll_call, daemon=True, name="roll-call")
    caller.start()
    caller.join(3 * seconds)
    if not present:  # the store did not answer (or is gone)
        return [0] if rank != 0 else []
    return [other for other in range(world_size) if other not in present]


class DeferredAgreement:
    """The max over ranks of `size` flags, on a CPU group of its own, started by one `exchange` and answered by the
    next, so that no rank waits on its device. Every rank makes and calls it at the same points, as any collective."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.group = dist.new_group(backend="gloo")  # CPU, whatever the training device
        self.in_flight: tuple[torch.Tensor, dist.Work] | None = None

    def exchange(self, flags: Sequence[bool]) -> list[bool]:
        """The agreement started by the previous call (all False if none is in flight); this call's starts now."""
        agreed = self.settle()
        self.start(flags)
        return agreed

    def start(self, flags: Sequence[bool]) -> None:
        """Start the agreement on `flags`, for the next `settle` or `exchange` to answer; none may be in flight.
        (`settle`, act, `start`: a flag the acting clears, a clock a checkpoint resets, is not sent once more.)"""
        if self.in_flight is not None:  # its collective would never be waited for, and the next one would hang
            raise RuntimeError("an agreement is in flight already: settle it first")
        sent = torch.tensor([int(flag) for flag in flags], dtype=torch.int32)
        self.in_flight = sent, dist.all_reduce(sent, op=dist.ReduceOp.MAX, group=self.group, async_op=True)

    def settle(self) -> list[bool]:
        """The agreement in flight, waited for on the ranks' CPU threads, not on a device; all False if none was."""
        if self.in_flight is None:
            return [False] * self.size
        sent, work = self.in_flight
        self.in_flight = None
        work.wait()
        return [bool(value) for value in sent.tolist()]

    def now(self, flags: Sequence[bool]) -> list[bool]:
        """What any rank has flagged by now, waited for: the agreement in flight, or'ed with `flags` agreed at once."""
        earlier = self.exchange(flags)
        return [a or b for a, b in zip(earlier, self.settle(), strict=True)]


def check_same_config_on_every_rank(config: dict | None) -> None:
    """Stops a distributed run, in one line on every rank, when its ranks did not compose the same config (each
    torchrun worker, Slurm task and DDP child composes its own). Called by every rank once they have met."""
    configs: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(configs, config)
    for rank, other in enumerate(configs):
        keys = differing_keys(configs[0], other)
        if keys:
            raise UserError(
                f"rank {rank} composed a different config than rank 0 (at {', '.join(keys[:5])}): start every "
                "rank with the same --config-dir, --config-name and overrides"
            )


def differing_keys(first: object, second: object, prefix: str = "") -> list[str]:
    """The dotted keys at which two plain configs (nested dicts and lists) differ."""
    if isinstance(first, dict) and isinstance(second, dict):
        keys = sorted(set(first) | set(second), key=str)
        return [key for k in keys for key in differing_keys(first.get(k), second.get(k), f"{prefix}{k}.")]
    return [] if first == second else [prefix.rstrip(".") or "<root>"]


def die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends SIGKILL when the parent process ends (Linux only)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def quoted(value: str) -> str:
    """`value` as one Hydra override value, whatever characters it holds."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def child_command(ckpt_path: str | None = None) -> list[str]:
    """The command that runs the current Hydra job once more, as a plain run in the same directory: the program
    started as this one was, from the same config source, with the job's overrides (`ckpt_path` replacing its own)."""
    hydra = HydraConfig.get()
    script_mode = __main__.__spec__ is None  # `python project/train.py` rather than `python -m project.train`
    program = [to_absolute_path(sys.argv[0])] if script_mode else ["-m", __main__.__spec__.name]
    hydra_overrides = [
        override
        for override in OmegaConf.to_container(hydra.overrides.hydra)  # a ${...} in one is its value's, unresolved
        if not override.startswith(tuple(f"{key}=" for key in CHILD_HYDRA_KEYS))
    ]
    job_overrides = [o for o in command_line_overrides() if ckpt_path is None or not o.startswith("ckpt_path=")]
    if ckpt_path is not None:
        job_overrides.append(f"ckpt_path={quoted(ckpt_path)}")
    return [
        sys.executable,
        *program,
        *config_source_arguments(),
        *hydra_overrides,
        *job_overrides,
        "hydra.mode=RUN",
        f"hydra.run.dir={quoted(hydra.runtime.output_dir)}",
        f"hydra.job.name={hydra.job.name}",
        "hydra.output_subdir=null",
    ]


class HydraJobLauncher(ScriptLauncher):
    """Starts local ranks 1..N-1 as single runs of the current Hydra job, not of the command line (under `-m`, the
    whole sweep); notes the first to fail, and ends them with the job (`finish`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping = threading.Event()
        self.port_holder: socket.socket | None = None  # the run's MASTER_PORT, held until the job ends
        self.failure: str | None = None  # the line that names the first child to end badly, once one has
        self.failed_rank: int | None = None

    def launch(self, function: Callable, *args: Any, trainer: L.Trainer | None = None, **kwargs: Any) -> Any:
        """Lightning's `launch`, with this launcher's children and watcher instead of Lightning's child observer, which
        outlives the job and SIGKILLs the whole process (a sweep with it) once a finished job's child stops."""
        try:  # the processes a launcher started (srun's tasks, torchrun's workers) against devices and num_nodes
            self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        except ValueError as error:
            raise UserError(f"{' '.join(str(error).split())} (trainer.devices, trainer.num_nodes)") from None
        if not self.cluster_environment.creates_processes_externally:
            ckpt_path = inspect.signature(function).bind(*args, **kwargs).arguments.get("ckpt_path")
            self.start_children(None if ckpt_path is None else str(ckpt_path))
        set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)

    def start_children(self, ckpt_path: str | None) -> None:
        self.check_can_spawn_children()
        if "MASTER_PORT" not in os.environ:  # Lightning would pick a free port and let go of it until rank 0 binds it
            self.port_holder = reserved_port()
            os.environ["MASTER_PORT"] = str(self.port_holder.getsockname()[1])
        os.environ.update(
            MASTER_ADDR=self.cluster_environment.main_address,
            MASTER_PORT=str(self.cluster_environment.main_port),
            NODE_RANK=str(self.cluster_environment.node_rank()),
            LOCAL_RANK="0",
            WORLD_SIZE=str(self.num_processes * self.num_nodes),
        )
        command = child_command(ckpt_path)
        before_exec = die_with_parent if sys.platform == "linux" else None
        for local_rank in range(1, self.num_processes):
            environment = os.environ | {"LOCAL_RANK": str(local_rank)}
            child = subprocess.Popen(command, env=environment, cwd=get_original_cwd(), preexec_fn=before_exec)
            self.procs.append(child)
        threading.Thread(target=self.watch_children, daemon=True, name="child-watcher").start()

    def watch_children(self) -> None:
        """Beside training: note the first rank that ended badly, for rank 0's job to name. Should rank 0 still run
        `STOP_GRACE_SECONDS` later, it is stuck where Python cannot interrupt it: kill all, say that line, end."""
        while not self.stopping.is_set():
            if self.note_failed_child():
                if not self.stopping.wait(STOP_GRACE_SECONDS):
                    for child in self.procs:
                        child.kill()
                    print(f"error: {self.failure}", file=sys.stderr, flush=True)
                    os._exit(1)
                return
            if all(child.returncode == 0 for child in self.procs):
                return
            self.stopping.wait(0.2)

    def note_failed_child(self) -> bool:
        """Note (`failure`) the first child that has ended with an error; whether there was one."""
        first_rank = self.cluster_environment.node_rank() * self.num_processes
        for local_rank, child in enumerate(self.procs, start=1):
            code = child.poll()
            if code and not self.stopping.is_set():
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                self.failed_rank = first_rank + local_rank
                self.failure = f"rank {self.failed_rank} (pid {child.pid}) {how}: the run stops"
                return True
        return False

    def note_dead_child(self, wait: float) -> None:
        """Note the first child that has died (`failure`), or dies within `wait` s, then stop noting: a child that
        ends after this is the consequence of this rank's end, not its cause."""
        deadline = time.monotonic() + wait
        while self.failure is None and not self.stopping.is_set() and not self.note_failed_child():
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        self.stopping.set()

    def finish(self, failed: bool, timeout: float = 60.0) -> None:
        """End the children, once (a failed job's end calls this twice): after a success wait for them (up to `timeout`
        s), after a failure kill them, who would sit in a collective until gloo's 30-minute timeout."""
        self.stopping.set()
        for child in self.procs:
            if failed:
                child.kill()
            try:
                child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.procs.clear()
        if self.port_holder is not None:
            self.port_holder.close()
            self.port_holder = None

    def kill(self, signum: signal.Signals) -> None:
        """Lightning's stop of the children (Ctrl-C, SIGTERM): their ends are then no failure to name."""
        self.stopping.set()
        super().kill(signum)


class HydraJobRanks(OwnScriptLauncher):
    """Mixed in before a Lightning strategy (`HydraDDPStrategy`, trainer=fsdp's): ranks started by `HydraJobLauncher`,
    stopped by SIGTERM at one same step, and a failed meeting of theirs ended in one line."""

    sigterm_pending = False  # set by the SIGTERM handler; kept through fit and test
    sigterm_agreement: DeferredAgreement | None = None  # made once the ranks have met

    def setup_environment(self) -> None:
        """Lightning's meeting of the ranks, in one line where it fails; then the config check and the agreement."""
        self.note_sigterm_without_collectives()
        try:
            super().setup_environment()
        except dist.DistError as error:
            address = f"{self.cluster_environment.main_address}:{self.cluster_environment.main_port}"
            port = port_in_use(error)
            if port is not None:  # rank 0 could not serve the run's store there
                raise UserError(
                    f"port {port} is in use on {self.cluster_environment.main_address} (another program or run holds "
                    "it): pick another MASTER_PORT"
                ) from None
            reason = " ".join(str(error).split()[:40])
            raise UserError(
                f"the {self.world_size} processes of this run did not all meet at {address} within "
                f"{strategy_timeout(self)} ({reason}): start the same command on every node with the same MASTER_ADDR "
                f"and MASTER_PORT, or allow more time with {TIMEOUT_KEY}"
            ) from None
        check_same_config_on_every_rank(run_config_of(self.lightning_module.trainer))
        self.sigterm_agreement = DeferredAgreement(size=1)
        skip_lightning_sigterm_broadcast(self.lightning_module.trainer)

    def set_world_ranks(self) -> None:
        """Lightning's, then, on a rank that is to join the run's store rather than serve it, a check that what
        listens at MASTER_ADDR:MASTER_PORT is that store: against another program torch would wait past `timeout`."""
        super().set_world_ranks()
        if self.global_rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # it serves the store
            return
        address, port = self.cluster_environment.main_address, self.cluster_environment.main_port
        timeout = strategy_timeout(self)
        seconds = timeout.total_seconds() if timeout else 1800.0
        if answers_as_store(address, port, seconds) is False:
            raise UserError(
                f"nothing at {address}:{port} answers as this run's store within {seconds:g} s (another program holds "
                "that port): MASTER_ADDR and MASTER_PORT must be rank 0's address and a port no other program uses "
                f"({TIMEOUT_KEY} sets the wait)"
            )

    def script_launcher(self) -> HydraJobLauncher:
        return HydraJobLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def note_sigterm_without_collectives(self) -> None:
        """On SIGTERM, only forward it to the children and note it (`sigterm_pending`), where Lightning's handler would
        broadcast from inside the signal handler; the ranks agree on it between batches and all stop after the same."""

        def note_sigterm(signum: int, frame: object) -> None:
            log.info(f"[rank: {self.global_rank}] Received SIGTERM: stopping after the next step")
            if not self.sigterm_pending and self.launcher is not None:
                self.launcher.kill(signum)
            self.sigterm_pending = True

        replace_sigterm_notifier(self.lightning_module.trainer, note_sigterm)

    def sigterm_on_any_rank(self) -> bool:
        """Whether SIGTERM reached any rank by now (every rank must ask at the same point)."""
        return self.sigterm_agreement.now([self.sigterm_pending])[0]

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Read the SIGTERM agreement started at the previous batch, and start this batch's: a SIGTERM during step k
        stops every rank after step k + 2, and no rank waits on its device for it."""
        super().on_train_batch_start(batch, batch_idx)
        (sigterm,) = self.sigterm_agreement.exchange([self.sigterm_pending])
        if sigterm:
            flag_sigterm(self.lightning_module.trainer)


class HydraDDPStrategy(HydraJobRanks, DDPStrategy):
    """Lightning's DDP, its ranks started and stopped as `HydraJobRanks` says."""


def torchs_own_order(loader: object) -> bool:
    """Whether `loader` is a plain `DataLoader` over a map-style dataset that draws its order from torch's own random
    or sequential sampler, batched by torch's own `BatchSampler`: one whose sampler the engine may put another in
    place of (its class, dataset and arguments kept, `upstream.with_sampler`)."""
    return (
        isinstance(loader, DataLoader)
        and not isinstance(loader.dataset, IterableDataset)
        and loader.batch_size is not None
        and type(loader.sampler) in (SequentialSampler, RandomSampler)
        and type(loader.batch_sampler) is BatchSampler
    )


def evaluated_once(loader: Any, trainer: L.Trainer, stage: str) -> Any:
    """`loader` (validation or test) sharing its samples out among the processes with none of them twice.

    Lightning gives each process a `DistributedSampler`, which repeats samples to even out the shares: a set the
    processes cannot split evenly counts some samples twice in every metric and in results.json, and the numbers
    differ from `project.evaluate`'s on one process. `UnrepeatedDistributedSampler` gives process r the samples
    r, r + N, r + 2N, ... and nothing twice (Lightning leaves a `DistributedSampler` it finds in place); the shares
    may differ by a sample, and a metric logged with `sync_dist=True` (mean over the processes of each one's sum and
    its count) is then the mean over the samples. A loader with a sampler of its own, or an iterable dataset, is left
    as it is.
    """
    if trainer.world_size == 1 or not torchs_own_order(loader):
        return loader
    samples, processes = len(loader.dataset), trainer.world_size
    if samples < processes:
        # A process without a sample would skip the epoch's sum over processes and leave the others waiting.
        raise UserError(
            f"the {stage} set has {samples} samples, fewer than the {processes} processes: run on fewer devices or "
            "use a larger set"
        )
    check_even_batches(samples, processes, loader.batch_size, trainer, stage)
    sampler = UnrepeatedDistributedSampler(
        loader.dataset, num_replicas=processes, rank=trainer.global_rank, shuffle=False
    )
    return with_sampler(loader, sampler)


def check_even_batches(samples: int, processes: int, batch_size: int, trainer: L.Trainer, stage: str) -> None:
    """Refuse shares of different batch counts where every batch is a collective (a sharded model gathers its
    parameters for each forward): the process with one batch more would wait for the others forever."""
    if not isinstance(trainer.strategy, (FSDPStrategy, ModelParallelStrategy)):
        return
    largest, smallest = -(-samples // processes), samples // processes
    if -(-largest // batch_size) != -(-smallest // batch_size):  # only where the smaller share fills its batches
        fitting = next(size for size in range(2, smallest + 2) if smallest % size)
        raise UserError(
            f"the {stage} set's {samples} samples split into shares of {largest} and {smallest} among {processes} "
            f"processes, {-(-largest // batch_size)} and {-(-smallest // batch_size)} batches of {batch_size}, and a "
            "sharded model's processes must run the same number of batches (each gathers its parameters): choose a "
            f"data.batch_size that does not divide {smallest} (such as {fitting}), or another number of devices"
        )
