"""Real multi-node Slurm: jobs on the local two-node cluster (scripts/slurm/local_cluster.sh), submitted as users do.

The cluster is brought up outside the tests (`make slurm-up`, as root; CI does it); without it every test here skips
and says so. Jobs run this test session's Python (`PROJECT_PYTHON`) from a temporary submit directory, so their run
dirs (`outputs/slurm-<job id>.0`) and logs land there. The two nodes are network namespaces of this machine sharing
its filesystem, so the small MNIST files of `mnist_root` are visible to every task.
"""

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    REPO,
    check_ok,
    environment,
    free_port,
    histories,
    last_weights,
    loss_gap,
    part_present,
    python,
    read_json,
    requires,
    run_module,
    simulated_slurm_nodes,
    weight_gap,
)
from tests.tensorboard_events import read_scalars

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CLUSTER_SCRIPT = REPO / "scripts" / "slurm" / "local_cluster.sh"
CLUSTER_ENV_FILE = Path(os.environ.get("LOCAL_SLURM_DIR", "/tmp/project-local-slurm")) / "env"
TRAIN_SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
REFERENCE_SBATCH = REPO / "scripts" / "slurm" / "reference.sbatch"
NOT_UP = "needs a local Slurm cluster: as root run `make slurm-up` (after `make system-deps`)"
TOLERANCE = 1e-6
TRAIN_IMAGES = 350  # the 400 small training images less data.val_size=50
JOB_TIMEOUT = 240  # seconds; a job on the idle local cluster takes 15-45
TORCHRUN_SCRIPT = REPO / "scripts" / "torchrun" / "train.sh"
TUTORIAL_SHAPE = ("--nodes=2", "--ntasks-per-node=3")  # the Slurm tutorial's job: 2 nodes × 3 processes
TWO_EPOCHS_OF_25 = ("data.batch_size=25", "trainer.max_epochs=2")
SIX_RANK_SHARE = 59  # 350 images over 6 ranks: DistributedSampler pads to 354


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, str]:
    """The environment jobs are submitted with, before the tests' own: the cluster's SLURM_CONF and this session's.

    Variables of an enclosing Slurm job or launcher are dropped: sbatch passes the whole environment on to the job.
    """
    if not CLUSTER_ENV_FILE.is_file() or shutil.which("sbatch") is None:
        pytest.skip(NOT_UP)
    status = subprocess.run(["bash", str(CLUSTER_SCRIPT), "status"], capture_output=True, text=True, timeout=60)
    if status.returncode != 0:
        pytest.skip(f"{NOT_UP}; local_cluster.sh status says: {status.stderr.strip()}")
    cluster = dict(re.findall(r"^export (\w+)=(.*)$", CLUSTER_ENV_FILE.read_text(), re.MULTILINE))
    if cluster.get("LOCAL_SLURM_NODES") != "2":
        pytest.skip(f"needs 2 nodes, the cluster has {cluster.get('LOCAL_SLURM_NODES')}: run `make slurm-up`")
    launcher_variables = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"}
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in launcher_variables}
    return inherited | cluster


@pytest.fixture
def slurm_env(slurm_cluster: dict[str, str]) -> dict[str, str]:
    """The cluster's environment, with this test's Python (`PROJECT_PYTHON`: its tasks forked from the preloaded
    Python, in their node's namespaces, tests/preloaded_python.py; in a `fresh` test the venv's own), one thread per
    process."""
    return environment(slurm_cluster | {"PROJECT_PYTHON": python()})


@pytest.fixture
def job_ids(slurm_env: dict[str, str]) -> Iterator[list[str]]:
    """Ids of the jobs a test submits; whatever of them still runs when the test ends (e.g. it failed) is cancelled."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], env=slurm_env, capture_output=True, timeout=60)


def submit(
    script: Path, *overrides: str, cwd: Path, env: dict, job_ids: list[str], options: tuple[str, ...] = ()
) -> tuple[str, subprocess.Popen]:
    """`sbatch --wait` of `script` (on CPUs: --gres=none) from `cwd`; the job id at once and the waiting sbatch."""
    (cwd / "outputs").mkdir(parents=True, exist_ok=True)  # for the job's log, as in a clone of the repository
    command = ["sbatch", "--wait", "--parsable", "--gres=none", *options, str(script), *overrides]
    sbatch = subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    job_id = sbatch.stdout.readline().strip()
    if not job_id:
        raise AssertionError(f"sbatch submitted nothing: {sbatch.communicate(timeout=60)[1]}")
    job_ids.append(job_id)
    return job_id, sbatch


def wait_for_job(sbatch: subprocess.Popen, log: Path) -> int:
    """The job's exit status, as `sbatch --wait` returns it once the job has ended (after any requeues)."""
    try:
        return sbatch.wait(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the job ran past {JOB_TIMEOUT} s; its log ends:\n{job_log(log)[-3000:]}") from None


def job_log(log: Path) -> str:
    return log.read_text(errors="replace") if log.is_file() else f"(no log at {log})"


def assert_job_succeeded(sbatch: subprocess.Popen, log: Path) -> None:
    status = wait_for_job(sbatch, log)
    assert status == 0, f"job exit status {status}; its log ends:\n{job_log(log)[-3000:]}"


def wait_until(condition: Callable[[], bool], sbatch: subprocess.Popen, log: Path, what: str) -> None:
    """Poll `condition` while the job is still being waited for; fail with the log if it ends or takes too long."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not condition():
        if sbatch.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the job never got to: {what}; its log ends:\n{job_log(log)[-3000:]}")
        time.sleep(0.2)


def run_dirs(submit_dir: Path) -> list[str]:
    """The run directories under the submit dir's outputs/ (which also holds the jobs' logs)."""
    return sorted(p.name for p in (submit_dir / "outputs").iterdir() if p.is_dir())


def small_mnist(mnist_root: Path, *extra: str, experiment: str = "mnist_slurm") -> list[str]:
    """An MNIST recipe (by default the tutorial's Slurm one) on the small test files."""
    return [f"experiment={experiment}", f"data.root={mnist_root}", "data.download=false", "data.val_size=50", *extra]


def compare_runs(run_dir: Path, expected_dir: Path, weights: dict, expected_weights: dict) -> tuple[float, float]:
    """(largest per-step loss difference over all ranks, largest final weight difference)."""
    got, expected = histories(run_dir), histories(expected_dir)
    assert [h["world_size"] for h in got] == [h["world_size"] for h in expected]
    loss_diff = max(
        loss_gap(mine["step_losses"], theirs["step_losses"]) for mine, theirs in zip(got, expected, strict=True)
    )
    return loss_diff, weight_gap(weights, expected_weights)


@pytest.fixture(scope="module")
def six_processes_on_one_host(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> Path:
    """What the tutorial's 2 × 3 job must compute: 6 DDP processes on this one host."""
    run_dir = tmp_path_factory.mktemp("one-host") / "run"
    args = small_mnist(mnist_root, *TWO_EPOCHS_OF_25, "trainer=ddp", "trainer.devices=6", "trainer.num_nodes=1")
    check_ok(run_module("project.train", *args, f"hydra.run.dir={run_dir}", cwd=run_dir.parent))
    return run_dir


def torchrun_on_two_hosts(overrides: list[str], cwd: Path, env: dict) -> list[subprocess.Popen]:
    """scripts/torchrun/train.sh run as docs/torchrun.md says, once on each node of the local cluster (their own
    addresses and hostnames, without Slurm), 3 processes each, meeting at node1."""
    cwd.mkdir()
    launch = {"NODES": "2", "PROCS_PER_NODE": "3", "ENDPOINT": f"node1:{free_port()}", "RUN_ID": "two-hosts"}
    return [
        subprocess.Popen(
            ["bash", str(CLUSTER_SCRIPT), "on", node, str(TORCHRUN_SCRIPT), *overrides],
            cwd=cwd,
            env={**env, **launch, "TIMEOUT": str(JOB_TIMEOUT)},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for node in ("node1", "node2")
    ]


def test_the_tutorials_two_by_three_job_computes_alike_on_every_launcher(
    tmp_path: Path, mnist_root: Path, slurm_env: dict, job_ids: list[str], six_processes_on_one_host: Path
):
    """2 nodes × 3 processes: Lightning under srun (LOCAL_RANK 0-2 on each node), and where their parts are here the
    same job sharded (trainer=fsdp), the reference spawning 3 per node under srun, and Lightning under torchrun on
    the same two hosts, each equal to 6 processes on one host."""
    overrides = small_mnist(mnist_root, *TWO_EPOCHS_OF_25)
    jobs = {
        "slurm job": submit(
            TRAIN_SBATCH, *overrides, cwd=tmp_path / "lightning", env=slurm_env, job_ids=job_ids, options=TUTORIAL_SHAPE
        )
    }
    if part_present("fsdp"):
        jobs["slurm fsdp job"] = submit(
            TRAIN_SBATCH,
            *overrides,
            "trainer=fsdp",
            cwd=tmp_path / "fsdp",
            env=slurm_env,
            job_ids=job_ids,
            options=TUTORIAL_SHAPE,
        )
    if part_present("reference"):
        reference_env = {**slurm_env, "DEVICES_PER_NODE": "3"}  # the tutorial's 3 GPUs per node, as CPU processes
        jobs["slurm reference job"] = submit(
            REFERENCE_SBATCH, *overrides, cwd=tmp_path / "reference", env=reference_env, job_ids=job_ids
        )
    runs = {}
    if part_present("torchrun"):
        agents = torchrun_on_two_hosts(overrides, tmp_path / "torchrun", slurm_env)
        for node, agent in zip(("node1", "node2"), agents, strict=True):
            stdout, stderr = agent.communicate(timeout=2 * JOB_TIMEOUT)
            check_ok(subprocess.CompletedProcess(agent.args, agent.returncode, stdout, stderr))
            assert "torchrun run two-hosts: 2 node(s) x 3 process(es), rendezvous node1:" in stdout
            assert stdout.splitlines()[0].endswith(f"on {node}"), "each agent ran on its own host"
        runs["torchrun on two hosts"] = tmp_path / "torchrun" / "outputs" / "torchrun-two-hosts"
    for name, (job_id, sbatch) in jobs.items():
        submit_dir = {"slurm job": "lightning", "slurm fsdp job": "fsdp", "slurm reference job": "reference"}[name]
        log_name = "reference" if name == "slurm reference job" else "train"
        assert_job_succeeded(sbatch, tmp_path / submit_dir / "outputs" / f"{log_name}-{job_id}.out")
        runs[name] = tmp_path / submit_dir / "outputs" / f"slurm-{job_id}.0"

    for run_dir in runs.values():
        assert run_dirs(run_dir.parents[1]) == [run_dir.name], "one run dir per launch"
        ranks = histories(run_dir)
        assert [(h["rank"], h["world_size"]) for h in ranks] == [(rank, 6) for rank in range(6)]
        assert all(h["epoch_samples"] == [SIX_RANK_SHARE] * 2 for h in ranks), "each rank its share of the data"
    lightning_id = jobs["slurm job"][0]
    lightning_log = tmp_path / "lightning" / "outputs" / f"train-{lightning_id}.out"
    assert f"job {lightning_id} (restart 0): 2 node(s)" in job_log(lightning_log)
    assert "3 task(s) per node" in job_log(lightning_log)
    assert read_json(runs["slurm job"] / "results.json")["world_size"] == 6
    assert len(read_scalars(runs["slurm job"] / "tensorboard")["val/loss"]) == 2, (
        "TensorBoard: one validation per epoch"
    )

    expected_weights = last_weights(six_processes_on_one_host)
    for name, run_dir in runs.items():
        weights = (
            torch.load(run_dir / "checkpoints" / "model.pt", weights_only=True)
            if name == "slurm reference job"
            else last_weights(run_dir)
        )
        loss_diff, weight_diff = compare_runs(run_dir, six_processes_on_one_host, weights, expected_weights)
        print(
            f"\n{name} (2 × 3) vs 6 processes on one host: max |step loss diff| {loss_diff:.2e}, "
            f"|weight diff| {weight_diff:.2e}"
        )
        assert loss_diff <= TOLERANCE and weight_diff <= TOLERANCE, name


def test_submitit_sweep_runs_each_point_as_a_slurm_job_and_summarises_them(
    tmp_path: Path, mnist_root: Path, slurm_env: dict, job_ids: list[str]
):
    sweep_dir = tmp_path / "sweep"
    command = [python(), "-m", "project.train", "-m", "hydra/launcher=slurm", "model.optimizer.lr=0.1,0.5"]
    # One process per job (hydra.launcher: 1 node, 1 task).
    overrides = small_mnist(mnist_root, "data.batch_size=25", "trainer.max_epochs=2", "logger=none", experiment="mnist")
    try:
        sweep = subprocess.run(
            [*command, *overrides, f"hydra.sweep.dir={sweep_dir}"],
            cwd=tmp_path,
            env=slurm_env,
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT,
        )
    finally:  # submitit names each job's folder <array job id>_<index>
        job_ids += {p.name.split("_")[0] for p in sweep_dir.glob(".submitit/*_*") if p.is_dir()}
    check_ok(sweep)

    slurm_logs = sorted(p.name for p in sweep_dir.glob(".submitit/*_*/*_log.out"))
    assert [re.sub(r"^\d+", "<id>", name) for name in slurm_logs] == ["<id>_0_0_log.out", "<id>_1_0_log.out"]
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [job.name for job in jobs] == ["0", "1"]
    summary = sweep.stdout[sweep.stdout.index("Sweep: 2 job(s)") :]
    final_losses = []
    for job, lr in zip(jobs, (0.1, 0.5), strict=True):
        assert f"model.optimizer.lr={lr}" in (job / ".hydra" / "overrides.yaml").read_text()
        val_acc = read_json(job / "results.json")["val/acc"]
        line = next(line for line in summary.splitlines() if line.startswith(f"{job.name}    "))
        assert f"model.optimizer.lr={lr}" in line and f"{val_acc:.4f}" in line and str(job) in line
        final_losses.append(histories(job)[0]["step_losses"][-1])
    assert final_losses[0] != final_losses[1], "the two jobs trained with different learning rates"


@requires("optuna")
def test_a_search_spread_over_a_slurm_array_shares_one_study(
    tmp_path: Path, mnist_root: Path, slurm_env: dict, job_ids: list[str]
):
    """docs/optuna.md's array line, two tasks: each is a worker of one search on one journal file; together they run
    the study's n_trials, each trial once, and each task's log names the trials it ran (read from the logs and job
    dirs: the optuna part's package is its own)."""
    search = [
        "hydra.mode=MULTIRUN",
        "hparams_search=mnist_optuna",
        "hydra.sweeper.storage=journal://outputs/search.log",
    ]
    overrides = [*small_mnist(mnist_root, "trainer.max_epochs=1", experiment="mnist"), *search]
    overrides.append("hydra.sweeper.n_trials=4")
    job_id, sbatch = submit(
        TRAIN_SBATCH, *overrides, cwd=tmp_path, env=slurm_env, job_ids=job_ids, options=("--array=0-1", "--nodes=1")
    )
    assert_job_succeeded(sbatch, tmp_path / "outputs" / f"train-{job_id}.out")

    logs = sorted((tmp_path / "outputs").glob("train-*.out"))
    assert len(logs) == 2, logs
    ran = [re.search(r"this worker ran trial\(s\) ([\d, ]+|none) of the study", job_log(log)) for log in logs]
    assert all(ran), [job_log(log)[-2000:] for log in logs]
    numbers = [int(n) for found in ran if found.group(1) != "none" for n in found.group(1).split(", ")]
    finished = [int(path.parent.name) for path in (tmp_path / "outputs").glob("*/*/[0-9]*/results.json")]
    assert sorted(finished) == [0, 1, 2, 3], "the study's 4 trials finished, each in the sweep dir of its worker"
    assert sorted(numbers) == [0, 1, 2, 3], "each trial run once, by one of the two"


def test_requeued_job_resumes_in_its_run_dir_and_equals_an_uninterrupted_run(
    tmp_path: Path, mnist_root: Path, slurm_env: dict, job_ids: list[str]
):
    """Requeued twice: by the time-limit warning (SIGUSR1 to the batch script) and by `scontrol requeue`.

    Each requeue ends the tasks with SIGTERM: they write last.ckpt at the step they stop after, and the requeued job
    resumes from exactly there.
    """
    epochs, batch = 16, 5  # 35 steps per rank and epoch: still training long after the first last.ckpt
    overrides = small_mnist(mnist_root, f"data.batch_size={batch}", f"trainer.max_epochs={epochs}", "logger=none")
    (tmp_path / "uninterrupted").mkdir()
    with ThreadPoolExecutor(1) as background:
        uninterrupted = background.submit(simulated_slurm_nodes, "project.train", overrides, tmp_path / "uninterrupted")
        job_id, sbatch = submit(TRAIN_SBATCH, *overrides, cwd=tmp_path / "job", env=slurm_env, job_ids=job_ids)
        log = tmp_path / "job" / "outputs" / f"train-{job_id}.out"
        run_dir = tmp_path / "job" / "outputs" / f"slurm-{job_id}.0"
        last = run_dir / "checkpoints" / "last.ckpt"

        wait_until(last.is_file, sbatch, log, "its first last.ckpt")
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=slurm_env, check=True, timeout=60)
        wait_until(lambda: f"job {job_id} (restart 1)" in job_log(log), sbatch, log, "its first restart")
        restarted = time.time()
        wait_until(lambda: last.stat().st_mtime > restarted, sbatch, log, "a last.ckpt after its first restart")
        subprocess.run(["scontrol", "requeue", job_id], env=slurm_env, check=True, timeout=60)
        assert_job_succeeded(sbatch, log)
        for node in uninterrupted.result(timeout=JOB_TIMEOUT):
            check_ok(node)

    assert f"job {job_id} (restart 2)" in job_log(log) and "time limit near: requeueing" in job_log(log)
    assert run_dirs(tmp_path / "job") == [run_dir.name], "the requeued job found its run dir again"
    history = histories(run_dir)[0]
    # Each requeue's SIGTERM stopped the tasks after one same step, which they wrote to last.ckpt (mid-epoch).
    stops = re.findall(r"stopped by SIGTERM in epoch \d+: resume from its last checkpoint \(step (\d+)\)", job_log(log))
    assert len(stops) >= 2, "the stopped attempts say where they stopped"
    resumed_at = history["first_step"]
    assert resumed_at == int(stops[-1]), "the last attempt resumed from the step the second attempt stopped after"
    assert read_json(run_dir / "results.json")["epochs"] == epochs

    expected_dir = tmp_path / "uninterrupted" / "outputs" / "slurm-4242.0"
    resumed_steps = histories(expected_dir)[0]["step_losses"][resumed_at:]
    loss_diff = loss_gap(history["step_losses"], resumed_steps)
    weight_diff = weight_gap(last_weights(run_dir), last_weights(expected_dir))
    print(f"\nrequeued twice vs uninterrupted: max |step loss diff| {loss_diff:.2e}, |weight diff| {weight_diff:.2e}")
    assert loss_diff <= TOLERANCE and weight_diff <= TOLERANCE


@pytest.mark.fresh  # the tasks' stdout block-buffered, as in a user's job that starts python without -u
def test_job_whose_training_fails_ends_non_zero_with_the_error_in_its_log(
    tmp_path: Path, slurm_env: dict, job_ids: list[str]
):
    nowhere = tmp_path / "nowhere"
    overrides = ["experiment=mnist_slurm", f"data.root={nowhere}", "data.download=false", "logger=none"]
    job_id, sbatch = submit(TRAIN_SBATCH, *overrides, cwd=tmp_path, env=slurm_env, job_ids=job_ids)
    log = tmp_path / "outputs" / f"train-{job_id}.out"
    assert wait_for_job(sbatch, log) == 2, "the project's exit status for a user's mistake, passed on by srun"
    lines = job_log(log).splitlines()
    error_lines = [line for line in lines if line.startswith("error:")]
    assert len(error_lines) == 2 and all(str(nowhere) in line for line in error_lines), "one line from each node"
    after = lines[max(number for number, line in enumerate(lines) if line.startswith("error:")) + 1 :]
    assert all(line.startswith("srun: ") for line in after), f"the tasks' own last words are their error lines: {after}"


def test_a_two_node_job_is_verified_bitwise_inside_an_allocation_of_its_shape(
    tmp_path: Path, slurm_env: dict, job_ids: list[str]
):
    """The toy trained by train.sbatch on 2 nodes × 1 task, then `salloc --nodes=2 --ntasks-per-node=1 python -m
    project.verify <its run dir>`: the re-run's tasks are started by srun, one per node, and equal the job's."""
    job_id, sbatch = submit(
        TRAIN_SBATCH, "logger=none", "trainer.max_epochs=1", cwd=tmp_path, env=slurm_env, job_ids=job_ids
    )
    assert_job_succeeded(sbatch, tmp_path / "outputs" / f"train-{job_id}.out")
    run_dir = tmp_path / "outputs" / f"slurm-{job_id}.0"
    shape = ["--nodes=2", "--ntasks-per-node=1", "--gres=none"]
    command = ["salloc", *shape, python(), "-m", "project.verify", str(run_dir)]
    verified = check_ok(
        subprocess.run(command, cwd=tmp_path, env=slurm_env, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    )
    lines = verified.stdout.strip().splitlines()
    assert lines[-1] == "reproduced bitwise: 1 step(s) on each of 2 process(es)", verified.stdout
    (rerun,) = (run_dir / "verify").iterdir()
    receipts = [read_json(rerun / name)["segments"][-1] for name in ("receipt.json", "receipt.rank1.json")]
    assert {receipt["machine"]["host"] for receipt in receipts} == {"node1", "node2"}, "one task on each node"
