"""Every wait on another process ends within its timeout, in one line naming who did not answer.

Each case runs the entry point as a user would (a process of its own, with the waits set short), makes one peer
fail to answer (a port held by a socket of the test's own, a rank stopped by SIGSTOP), and checks the end: exit
status, the one `error:` line, and no process of the run left. A DataLoader worker that stalls is the one case run
in-process: the behaviour is the job's end (`project.engine.job.isolated_job`), whatever data module set the timeout.
torchrun's own waits are in tests/optional/torchrun/test_torchrun.py.
"""

import gc
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from project.engine.errors import RunStopped
from project.engine.job import isolated_job, silence_line
from tests.faults import (
    DDP,
    ENV,
    LONG_TOY_RUN,
    START_TIMEOUT,
    USER_ERROR,
    alive,
    assert_ends_in_error_line,
    assert_no_process_left,
    background_run,
    descendants,
    end_of,
    output_of,
    processes_in,
    wait_for_file,
)
from tests.foreign_modules import RegressionModule, line_points
from tests.helpers import free_port, held_port, run_module

pytestmark = pytest.mark.slow  # every case starts the entry point
ANOTHER_RANK_GONE = 1  # a rank of a running job went away: exit 1, as for a rank that died (project.engine.job)
# The collective timeout of the silent-rank case: short, yet room for the second rank to start and join.
SHORT_TIMEOUT = 8


def run_ending_at_start(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`project.train <args>` in `tmp_path`, with the launch's variables `env`: a run that is to end as it starts."""
    return run_module(
        "project.train",
        *args,
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        timeout=START_TIMEOUT,
        env={**ENV, **env},
    )


def test_a_master_port_in_use_ends_the_run_in_one_line_naming_it(tmp_path: Path):
    with held_port() as port:
        result = run_ending_at_start(tmp_path, *DDP, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR)
    assert line == f"error: port {port} is in use on 127.0.0.1 (another program or run holds it): " + (
        "pick another MASTER_PORT"
    )
    assert_no_process_left(tmp_path)


# Ranks that join the run's store rather than serve it, as torchrun starts them: rank 1 of a two-node launch, and rank 0
# where torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE, torch's own variable, "True" as it sets it).
JOINING_RANKS = {
    "rank 1": {"RANK": "1", "GROUP_RANK": "1"},
    "rank 0 under the agent's store": {"RANK": "0", "GROUP_RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"},
}


def joining_rank_at(tmp_path: Path, port: int, joining: str, run_id: str) -> subprocess.CompletedProcess:
    """One rank of a two-node launch (as torchrun starts it, `joining` of JOINING_RANKS) that joins the store at
    127.0.0.1:`port`, with a 2 s timeout."""
    joined = {"TORCHELASTIC_RUN_ID": run_id, "WORLD_SIZE": "2", "LOCAL_RANK": "0", **JOINING_RANKS[joining]}
    return run_ending_at_start(
        tmp_path,
        *DDP[:1],
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "trainer.strategy.timeout.seconds=2",
        env={**joined, "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
    )


@pytest.mark.parametrize("joining", JOINING_RANKS)
def test_a_master_port_another_program_holds_ends_a_joining_rank_in_one_line_within_the_timeout(
    tmp_path: Path, joining: str
):
    """A rank of a two-node launch that joins the store at a MASTER_ADDR:MASTER_PORT another program holds: torch's
    store client would wait there past trainer.strategy.timeout, without end."""
    with held_port() as port:
        started = time.monotonic()
        result = joining_rank_at(tmp_path, port, joining, "held")
        seconds = time.monotonic() - started
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR)
    assert line.startswith(f"error: nothing at 127.0.0.1:{port} answers as this run's store within 2 s"), line
    assert "trainer.strategy.timeout.seconds sets the wait" in line, line
    print(f"\n{joining} at a port another program holds: ended {seconds:.1f} s after its start (timeout 2 s)")
    assert_no_process_left(tmp_path)


def test_a_joining_rank_whose_store_never_comes_ends_in_one_line_within_the_timeout(tmp_path: Path):
    """Rank 1 of a two-node launch where nothing listens at MASTER_ADDR:MASTER_PORT (rank 0's node never started):
    nothing there to check, it waits for the store as torch does, trainer.strategy.timeout, and names the meeting."""
    port = free_port()
    result = joining_rank_at(tmp_path, port, "rank 1", "alone")
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR)
    assert line.startswith(
        f"error: the 2 processes of this run did not all meet at 127.0.0.1:{port} within 0:00:02 "
    ), line
    assert_no_process_left(tmp_path)


def test_a_rank_that_goes_silent_ends_the_run_in_one_line_naming_it_within_the_timeout(tmp_path: Path):
    """Rank 1 stopped (SIGSTOP) mid-training: rank 0's collective waits `trainer.strategy.timeout`, then names it."""
    run_dir = tmp_path / "run"
    args = [*LONG_TOY_RUN, *DDP, f"trainer.strategy.timeout.seconds={SHORT_TIMEOUT}", f"hydra.run.dir={run_dir}"]
    with background_run(args, tmp_path) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        launched = [proc.pid, *descendants(proc.pid)]
        assert len(launched) == 2, launched  # rank 0 and the process it started as rank 1
        # That process stands in for rank 1, forked by the preloaded Python (tests/preloaded_python.py); it passes
        # signals on, but SIGSTOP cannot be passed on: rank 1 itself is stopped, found by its working directory.
        (silent,) = set(processes_in(tmp_path)) - set(launched)
        everyone = [*launched, silent]
        os.kill(silent, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            status = end_of(proc, tmp_path, timeout=SHORT_TIMEOUT + START_TIMEOUT)
        finally:
            if alive(silent):
                os.kill(silent, signal.SIGCONT)
        seconds = time.monotonic() - stopped
    stdout, stderr = output_of(tmp_path)
    line = assert_ends_in_error_line(status, stdout, stderr, ANOTHER_RANK_GONE)
    assert line.startswith(
        f"error: rank 1 of the run did not answer for {SHORT_TIMEOUT} s (stopped, hung, or far slower than the "
        "others): find out why, or give it more time with trainer.strategy.timeout.seconds; then resume from its "
        "last checkpoint (step "
    ), line
    print(f"\nrank 1 stopped: the run ended {seconds:.1f} s later (trainer.strategy.timeout.seconds={SHORT_TIMEOUT})")
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


def test_a_rank_stuck_where_it_cannot_see_rank_0_end_is_ended_with_it(tmp_path: Path):
    """Rank 0 killed (SIGKILL: the OOM killer, say) while rank 1 is stuck outside any collective, where it cannot
    see the loss (stopped here; a long step or a hung call alike): the kernel ends rank 1 too, as the launch asked it
    to (Linux's parent-death signal). Without that it would wait for ever, holding its memory and devices."""
    run_dir = tmp_path / "run"
    with background_run([*LONG_TOY_RUN, *DDP, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        launched = [proc.pid, *descendants(proc.pid)]
        assert len(launched) == 2, launched  # rank 0 and the process it started as rank 1
        (stuck,) = set(processes_in(tmp_path)) - set(launched)  # rank 1 itself (as in the case above)
        os.kill(stuck, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGKILL)
        assert end_of(proc, tmp_path) == -signal.SIGKILL
    assert_no_process_left(tmp_path)


class StallingPoints(Dataset):
    """Points whose fifth comes only once the file `released` exists: its read hangs until the test has seen the run
    end (then the worker can be shut down as any, instead of after torch's wait for a worker that does not answer)."""

    def __init__(self, released: Path) -> None:
        self.points = line_points(16, torch.Generator().manual_seed(0))
        self.released = released

    def __len__(self) -> int:
        return len(self.points)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        while index == 4 and not self.released.exists():
            time.sleep(0.05)
        return self.points[index]


class StallingData(L.LightningDataModule):
    """A user's data module that bounds its loader's wait for a worker (torch's default waits without end)."""

    def __init__(self, released: Path) -> None:
        super().__init__()
        self.released = released

    def train_dataloader(self) -> DataLoader:
        return DataLoader(StallingPoints(self.released), batch_size=4, num_workers=1, timeout=2)


def test_a_stalled_dataloader_worker_ends_the_job_in_one_line_naming_the_data_module(tmp_path: Path):
    processes_before = set(descendants(os.getpid()))
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    started = time.monotonic()
    released = tmp_path / "released"
    with pytest.raises(RunStopped) as stopped, isolated_job(trainer):
        trainer.fit(RegressionModule(), datamodule=StallingData(released))
    seconds = time.monotonic() - started
    released.touch()
    assert stopped.value.exit_status == ANOTHER_RANK_GONE
    assert str(stopped.value) == (
        "a DataLoader worker of StallingData sent no batch within 2 s, its DataLoader's timeout (a hung or very slow "
        "read): find out what it waits on, or give that DataLoader a longer timeout; then it had written no "
        "checkpoint yet: run it again"
    )
    print(f"\na stalled DataLoader worker: the job ended {seconds:.1f} s after its start (timeout 2 s)")
    # The loader, held by the error's traceback, ends its worker once dropped (as a run's exit does).
    del stopped
    gc.collect()

    def started_here() -> set[int]:
        return {pid for pid in descendants(os.getpid()) if pid not in processes_before and alive(pid)}

    deadline = time.monotonic() + 30
    while (left := started_here()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"the stalled worker outlived its loader: {left}"


def test_the_silence_line_says_how_long_the_run_waited_in_seconds_to_the_millisecond():
    """torch says `waiting 2500ms`; the line says 2.5 s, not a rounded 2."""
    trainer = SimpleNamespace(checkpoint_callbacks=[])
    line = silence_line(RuntimeError("Timed out waiting 2500ms for recv"), [1], trainer)
    assert line.startswith("rank 1 of the run did not answer for 2.5 s (stopped, hung, or far slower")
    assert "did not answer (stopped" in silence_line(RuntimeError("Connection closed"), [], trainer)
