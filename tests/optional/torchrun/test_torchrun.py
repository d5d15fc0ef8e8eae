"""torchrun beyond one process group's life: elastic restarts that resume, and launches that fail in one line.

Each launch runs `python -m project.optional.torchrun.launcher` (torchrun, ending in one line when the launch fails) as
a user runs it
on every machine; "two machines" are two agents on this one (`tests.optional.torchrun.nodes`). The same launch on
two real hosts (network namespaces of the local cluster) is in tests/test_slurm.py.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    REPO,
    check_ok,
    environment,
    free_port,
    held_port,
    histories,
    last_weights,
    loss_gap,
    python,
    read_json,
    run_module,
    weight_gap,
)
from tests.optional.torchrun.nodes import torchrun_nodes

pytestmark = pytest.mark.slow
# The toy problem on two ranks: one step per rank and epoch, a last.ckpt after every epoch.
EPOCHS, KILLED_AT = 8, 4
TOY = ("logger=none", f"trainer.max_epochs={EPOCHS}")
# Rank 1 dies (SIGKILL) as epoch 4 starts, in the first attempt only: the restarted processes run on.
CRASH = (
    "+callbacks.crash._target_=tests.crash_callback.KillAtEpochStart",
    f"+callbacks.crash.epoch={KILLED_AT}",
    "+callbacks.crash.rank=1",
    "+callbacks.crash.attempt=0",
)
WITH_TEST_CALLBACKS = {"PYTHONPATH": str(REPO)}  # lets a run import tests.crash_callback
USER_ERROR = 2
START_TIMEOUT = 120  # a launch that fails at start takes a Python and torch start-up; longer is a hang


def run_dirs(cwd: Path) -> list[Path]:
    """Every run dir under `cwd/outputs` (each holds the claim file of its launch)."""
    return sorted(path.parent for path in (cwd / "outputs").rglob(".launch_id"))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run the interrupted ones must end equal to: one host, two processes, nobody killed."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    args = [*TOY, "trainer=ddp", "trainer.devices=2"]
    (agent,) = torchrun_nodes("project.train", args, cwd, run_id="uninterrupted", nodes=1, per_node=2)
    check_ok(agent)
    (run_dir,) = run_dirs(cwd)
    return run_dir


@pytest.mark.parametrize(("strategy", "nodes"), [("ddp", 1), ("fsdp", 2)], ids=["one host", "two hosts, fsdp"])
def test_a_killed_worker_is_restarted_and_the_run_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, uninterrupted: Path, strategy: str, nodes: int
):
    """torchrun restarts every process (on two hosts, the other host's too) and each resumes from last.ckpt.

    On two hosts only the failed worker's agent counts a restart; the other restarts its worker for the new
    rendezvous with the count unchanged, so both must resume from the run dir, not from the count. On two hosts the
    run is sharded (trainer=fsdp; how the ranks are started and restarted does not depend on the strategy): the ranks
    resume from their shards of the sharded last.ckpt, and end on DDP's weights (the same global batch).
    """
    per_node = 2 // nodes
    args = [*TOY, f"trainer={strategy}", f"trainer.num_nodes={nodes}", f"trainer.devices={per_node}", *CRASH]
    agents = torchrun_nodes(
        "project.train", args, tmp_path, "elastic", nodes, per_node, ("--max-restarts=1",), WITH_TEST_CALLBACKS
    )
    for agent in agents:
        check_ok(agent)
    (run_dir,) = run_dirs(tmp_path)
    ranks = histories(run_dir)
    assert [h["first_epoch"] for h in ranks] == [KILLED_AT, KILLED_AT], (
        "restarted, every rank resumed from epoch 4's checkpoint"
    )
    assert read_json(run_dir / "results.json")["epochs"] == EPOCHS
    expected = histories(uninterrupted)
    steps_per_epoch = len(expected[0]["step_losses"]) // EPOCHS
    loss_diff = max(
        loss_gap(mine["step_losses"], theirs["step_losses"][KILLED_AT * steps_per_epoch :])
        for mine, theirs in zip(ranks, expected, strict=True)
    )
    weight_diff = weight_gap(last_weights(run_dir), last_weights(uninterrupted))
    print(
        f"\n{strategy} restarted on {nodes} host(s) vs uninterrupted ddp: |step loss diff| {loss_diff}, "
        f"|weight diff| {weight_diff}"
    )
    assert loss_diff == 0.0 and weight_diff == 0.0, "bitwise, on CPU"


def test_a_worker_killed_with_no_restarts_left_ends_the_launch_naming_rank_and_signal(tmp_path: Path):
    args = [*TOY, "trainer=ddp", "trainer.devices=2", *CRASH]
    (agent,) = torchrun_nodes("project.train", args, tmp_path, "no-restarts", 1, 2, env=WITH_TEST_CALLBACKS)
    assert agent.returncode == 128 + 9, agent.stderr[-3000:]
    assert error_lines(agent.stderr)[-1:] == [agent.stderr.rstrip().splitlines()[-1]], "the last line is the error"
    assert "project.train: rank 1 was killed by SIGKILL" in agent.stderr.rstrip().splitlines()[-1]
    assert "Traceback" not in agent.stderr


def launch_alone(tmp_path: Path, *options: str) -> tuple[float, object]:
    """One agent of a two-node launch, started alone: (seconds it took to end, its result)."""
    launcher = (
        sys.executable,
        "-m",
        "project.optional.torchrun.launcher",
        "--nnodes=2",
        "--nproc-per-node=1",
        *options,
    )
    started = time.monotonic()
    result = run_module(
        "project.train",
        "trainer=ddp",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        cwd=tmp_path,
        launcher=launcher,
        timeout=START_TIMEOUT,
        env={"OMP_NUM_THREADS": "1"},
    )
    return time.monotonic() - started, result


def assert_one_error_line(result, *fragments: str) -> str:
    """Exit status 2, no traceback, and the last line of stderr an `error:` line holding `fragments`."""
    assert result.returncode == USER_ERROR, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.rstrip().splitlines()[-1]
    assert line.startswith("error: ") and all(fragment in line for fragment in fragments), line
    return line


def test_a_node_that_never_joins_ends_the_launch_in_one_line_within_join_timeout(tmp_path: Path):
    endpoint = f"127.0.0.1:{free_port()}"
    rendezvous = ("--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=alone", "--rdzv-conf=join_timeout=2")
    seconds, result = launch_alone(tmp_path, *rendezvous)
    assert_one_error_line(result, f"the rendezvous at {endpoint}", "did not gather --nnodes=2", "within 2 s")
    print(f"\na node alone: ended {seconds:.1f} s after its start (join_timeout=2)")


def test_a_rendezvous_endpoint_nobody_serves_ends_the_launch_in_one_line(tmp_path: Path):
    endpoint = "no-such-host.invalid:29400"
    rendezvous = ("--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=lost", "--rdzv-conf=read_timeout=2")
    seconds, result = launch_alone(tmp_path, *rendezvous)
    assert_one_error_line(result, f"cannot reach the rendezvous at {endpoint}", "--rdzv-endpoint must be")
    print(f"\nan endpoint nobody serves: ended {seconds:.1f} s after its start (read_timeout=2)")


def test_a_rendezvous_endpoint_another_program_holds_ends_the_launch_in_one_line_within_the_timeout(tmp_path: Path):
    """scripts/torchrun/train.sh with an ENDPOINT that something else listens on: torch's store client would wait
    there for ten minutes and more, whatever TIMEOUT says."""
    with held_port() as port:
        launch = {"NODES": "1", "PROCS_PER_NODE": "2", "RUN_ID": "held", "TIMEOUT": "2"}
        launch["ENDPOINT"] = f"127.0.0.1:{port}"
        started = time.monotonic()
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / "torchrun" / "train.sh"), "logger=none"],
            cwd=tmp_path,
            env=environment({**launch, "PROJECT_PYTHON": python()}),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        seconds = time.monotonic() - started
    assert_one_error_line(result, f"nothing at 127.0.0.1:{port} answers as a rendezvous within 2 s", "another program")
    print(f"\nan endpoint another program holds: ended {seconds:.1f} s after its start (TIMEOUT=2)")
    assert not (tmp_path / "outputs").exists(), "no run dir was made"


def test_a_master_port_in_use_ends_the_launch_in_one_line(tmp_path: Path):
    with held_port() as port:
        launcher = (
            sys.executable,
            "-m",
            "project.optional.torchrun.launcher",
            "--nproc-per-node=2",
            f"--master-port={port}",
        )
        result = run_module("project.train", "trainer=ddp", cwd=tmp_path, launcher=launcher, timeout=START_TIMEOUT)
    line = assert_one_error_line(result)
    assert line == f"error: --master-port={port} is in use on this machine: pick another port"


def test_a_multi_node_launch_without_a_rendezvous_id_is_refused_in_one_line(tmp_path: Path):
    """torchrun's static rendezvous (--node-rank, --master-addr) gives no id: nothing names the shared run dir."""
    static = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    overrides = ["trainer=ddp", "trainer.num_nodes=2", "trainer.devices=1"]
    nodes = [
        subprocess.Popen(
            [
                python(),
                "-m",
                "project.optional.torchrun.launcher",
                *static,
                f"--node-rank={node}",
                "-m",
                "project.train",
                *overrides,
            ],
            cwd=tmp_path,
            env=environment(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for node in range(2)
    ]
    for rank, node in enumerate(nodes):
        _, stderr = node.communicate(timeout=START_TIMEOUT)
        assert_one_error_line(
            subprocess.CompletedProcess(node.args, node.returncode, "", stderr), f"rank {rank} exited with status 2"
        )
        (worker_line,) = error_lines(stderr)[:-1]
        assert "needs --rdzv-id=<a name for this run>" in worker_line
    assert not (tmp_path / "outputs").exists(), "no run dir was made"
