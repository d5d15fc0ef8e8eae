"""Switches that combine: a launch's directory, its ranks' config, its weights, and what a job leaves behind."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
from project.engine import run_dir
from project.engine.build import build
from project.engine.checkpoints import resume_path
from project.engine.ddp import (
    DeferredAgreement,
    HydraDDPStrategy,
    HydraJobLauncher,
    check_same_config_on_every_rank,
    die_with_parent,
    differing_keys,
)
from project.engine.errors import RunStopped, UserError, exit_on_user_error
from project.engine.job import JOB_VARIABLES, isolated_job, stop_if_signalled
from project.engine.upstream import VERSION_BASE
from tests.collective_counter import count_collectives
from tests.helpers import (
    CONF_DIR,
    REPO,
    check_ok,
    environment,
    free_port,
    histories,
    mnist_overrides,
    one_rank_process_group,
    python,
    read_json,
    requires,
    run_module,
    spawning_preloaded,
)


def compose_train(*overrides: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose("train", overrides=list(overrides))


def test_choosing_data_and_model_gives_their_own_settings_not_the_toy_recipe():
    cfg = compose_train("data=fashion_mnist", "model=mnist_mlp", "data.root=/datasets", "data.download=false")
    assert (cfg.data.name, cfg.data.root, cfg.data.batch_size, cfg.data.val_size) == (
        "fashion_mnist",
        "/datasets",
        128,
        5000,
    )
    assert (cfg.trainer.max_epochs, cfg.trainer.log_every_n_steps) == (10, 50)
    toy = compose_train()
    assert (toy.data.batch_size, toy.trainer.max_epochs, toy.trainer.log_every_n_steps) == (2, 3, 1)
    assert compose_train("trainer=ddp").trainer.max_epochs == 3, "the toy's run length whatever the strategy"


@pytest.mark.parametrize("trainer", ["default", "ddp", pytest.param("dp", marks=requires("dp"))])
def test_the_everyday_trainer_knobs_need_no_plus_and_reach_the_trainer(tmp_path: Path, trainer: str):
    """`trainer.gradient_clip_val=0.5` as a user types it, under any trainer= config, is the Trainer's setting."""
    knobs = {
        "gradient_clip_val": 0.5,
        "accumulate_grad_batches": 2,
        "val_check_interval": 0.5,
        "limit_train_batches": 0.5,
        "limit_val_batches": 3,
        "limit_test_batches": 0.25,
        "max_steps": 7,
    }
    cfg = compose_train(
        f"trainer={trainer}", *(f"trainer.{key}={value}" for key, value in knobs.items()), f"run_dir={tmp_path}"
    )
    saved = dict(os.environ)  # building seeds (PL_GLOBAL_SEED) and may set launcher variables
    try:
        built = build(cfg, tmp_path).trainer
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert {key: getattr(built, key) for key in knobs} == knobs
    assert compose_train().trainer.gradient_clip_val is None, "unset: Lightning's default"


def test_launches_in_the_same_second_get_their_own_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(run_dir.time, "time", lambda: 1_800_000_000.0)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    parent = str(tmp_path / "outputs")
    first, second, third = (run_dir.launch_dir(parent) for _ in range(3))
    assert first == f"{parent}/{time.strftime(run_dir.TIME_FORMAT, time.localtime(1_800_000_000.0))}"
    assert (second, third) == (f"{first}-1", f"{first}-2")
    assert all((Path(d) / run_dir.CLAIM_FILE).is_file() for d in (first, second, third))


def test_processes_of_one_torchrun_launch_share_a_directory_another_launch_does_not(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setattr(run_dir, "process_start_time", lambda pid: 1_800_000_000.0)
    parent = str(tmp_path / "outputs")
    worker_one, worker_two = run_dir.launch_dir(parent), run_dir.launch_dir(parent)
    assert worker_one == worker_two, "same agent: same launch"
    monkeypatch.setattr(run_dir.os, "getppid", lambda: 1)
    assert run_dir.launch_dir(parent) == f"{worker_one}-1", "another agent started in the same second"


def test_workers_of_a_multi_node_torchrun_launch_name_their_directory_after_its_rendezvous_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Every node's workers, whatever their agent, agree; the same id again (a relaunch) finds the same directory."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "exp 1/a")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    parent = str(tmp_path / "outputs")
    node_one = run_dir.launch_dir(parent)
    monkeypatch.setattr(run_dir.os, "getppid", lambda: 1)  # the other node's agent
    assert run_dir.launch_dir(parent) == node_one == f"{parent}/torchrun-exp_1_a"


def test_a_torchrun_restart_carries_on_from_its_own_last_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Not from the checkpoint the launch started from (that would redo its progress); another network is refused."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "restarted")
    network = {"_target_": "project.example.networks.NeuralNetwork", "num_inputs": 2, "num_outputs": 2}
    config = {"model": {"_target_": "project.example.module.ClassifierModule", "network": network}}

    def write_checkpoint(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": {}, "config": config}, path)
        return path

    given, run = write_checkpoint(tmp_path / "given.ckpt"), tmp_path / "run"
    assert resume_path(str(given), run, tmp_path, config) == str(given), "first attempt: nothing of its own yet"
    own = write_checkpoint(run / "checkpoints" / "last.ckpt")
    assert resume_path(str(given), run, tmp_path, config) == resume_path(None, run, tmp_path, config) == str(own)
    other = {
        "model": {**config["model"], "network": {**network, "_target_": "project.example.networks.DeepNeuralNetwork"}}
    }
    with (
        initialize_config_dir(str(CONF_DIR), **VERSION_BASE),  # conf/ names the stored network: trusted
        pytest.raises(UserError, match="holds another model .*DeepNeuralNetwork.* with a new --rdzv-id"),
    ):
        resume_path(None, run, tmp_path, other)


def test_a_multi_node_torchrun_launch_without_an_id_ends_in_one_line(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(SystemExit) as stop:
        run_dir.launch_dir(str(tmp_path / "outputs"))
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: a multi-node torchrun launch needs --rdzv-id=")


def test_runs_typed_in_an_interactive_slurm_shell_do_not_share_the_jobs_directory(tmp_path: Path):
    """`srun --pty bash` then `python -m project.train`: Slurm's job and step ids are those of the shell."""
    shell_environment = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_TASK_PID": str(os.getpid())}
    for _ in range(2):
        check_ok(run_module("project.train", "logger=none", cwd=tmp_path, env=shell_environment))
    run_dirs = sorted(p.relative_to(tmp_path / "outputs") for p in (tmp_path / "outputs").glob("*/*"))
    assert len(run_dirs) == 2 and not any(str(p).startswith("slurm-") for p in run_dirs), run_dirs
    assert all(read_json(tmp_path / "outputs" / p / "results.json")["epochs"] == 3 for p in run_dirs)


@pytest.mark.slow
def test_ddp_started_as_a_script_trains_two_ranks(tmp_path: Path):
    """`python project/train.py trainer=ddp`: the children are started as the script, not as a module."""
    result = subprocess.run(
        [
            python(),
            str(REPO / "project" / "train.py"),
            "trainer=ddp",
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment(),
    )
    check_ok(result)
    assert [h["world_size"] for h in histories(tmp_path / "run")] == [2, 2]
    assert "AttributeError" not in result.stderr


@pytest.mark.slow
def test_ddp_resuming_last_hands_rank_zeros_choice_to_every_rank(tmp_path: Path):
    check_ok(run_module("project.train", "logger=none", "trainer.max_epochs=1", cwd=tmp_path))
    (earlier,) = (tmp_path / "outputs").glob("*/*/checkpoints/last.ckpt")
    check_ok(run_module("project.train", "logger=none", "trainer=ddp", "ckpt_path=last", cwd=tmp_path))
    (resumed,) = [p for p in (tmp_path / "outputs").glob("*/*/checkpoints/last.ckpt") if p != earlier]
    checkpoint = torch.load(resumed, weights_only=False)
    assert checkpoint["config"]["ckpt_path"] == str(earlier), "the stored config names the file resumed from"
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (2, 1 * 2 + 2 * 1), "2 steps alone, then 1 per DDP epoch"


def _gather_configs(rank: int, port: int, configs: list[dict], errors: "mp.Queue") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        check_same_config_on_every_rank(configs[rank])
        errors.put((rank, None))
    except UserError as error:
        errors.put((rank, str(error)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("second_seed", [1, 2])
def test_ranks_that_composed_different_configs_stop_with_one_line_naming_the_keys(second_seed: int):
    torch.set_num_threads(1)
    configs = [{"seed": 1, "data": {"batch_size": 2}}, {"seed": second_seed, "data": {"batch_size": 2}}]
    errors = mp.get_context("spawn").Queue()
    with spawning_preloaded():
        mp.start_processes(_gather_configs, args=(free_port(), configs, errors), nprocs=2, start_method="spawn")
    reported = dict(errors.get(timeout=60) for _ in range(2))
    if second_seed == 1:
        assert reported == {0: None, 1: None}
    else:
        expected = "rank 1 composed a different config than rank 0 (at seed): start every rank with the same"
        assert all(message.startswith(expected) for message in reported.values()), reported


def test_a_child_that_fails_first_is_noted_not_printed_beside_rank_zeros_own_error(capsys):
    """A user error every rank finds (a bad resume, a config check) ends rank 1 first when it starts faster: its own
    line is the one to read, so rank 0's launcher only notes the death, for the job to name if rank 0 has no error of
    its own (`project.engine.job`), instead of adding a line of its own between the two ranks' identical ones."""
    launcher = HydraJobLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    launcher.procs.append(subprocess.Popen(["sh", "-c", "exit 2"]))
    watcher = threading.Thread(target=launcher.watch_children)
    watcher.start()
    deadline = time.monotonic() + 30
    while launcher.failure is None and time.monotonic() < deadline:
        time.sleep(0.05)
    launcher.finish(failed=True)
    watcher.join(timeout=30)
    assert re.fullmatch(r"rank 1 \(pid \d+\) exited with code 2: the run stops", launcher.failure or "")
    assert capsys.readouterr().err == ""


def test_a_failed_child_on_a_later_node_is_named_by_its_rank_in_the_run(monkeypatch: pytest.MonkeyPatch):
    """On node 1 of a job of three processes a node, the launching process is rank 3 and its children ranks 4 and 5:
    the line names the child that failed by its rank in the run, as every other line of the run names a rank."""
    monkeypatch.setenv("NODE_RANK", "1")
    launcher = HydraJobLauncher(LightningEnvironment(), num_processes=3, num_nodes=2)
    launcher.procs += [SimpleNamespace(pid=101, poll=lambda: None), SimpleNamespace(pid=102, poll=lambda: 2)]
    assert launcher.note_failed_child()
    assert (launcher.failed_rank, launcher.failure) == (5, "rank 5 (pid 102) exited with code 2: the run stops")


def children_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, num_processes: int, num_nodes: int, node_rank: int = 0
) -> list:
    """What `HydraJobLauncher.start_children` on node `node_rank` gives `subprocess.Popen` for each child (its
    keywords), none started."""
    for name in JOB_VARIABLES:  # unset for the launch, which sets them in this process, and unset again after it
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("NODE_RANK", str(node_rank))
    started = []

    def popen(command: list[str], **kwargs) -> SimpleNamespace:
        started.append(kwargs)
        return SimpleNamespace(
            pid=0, returncode=None, poll=lambda: None, wait=lambda timeout=None: 0, kill=lambda: None
        )

    monkeypatch.setattr("project.engine.ddp.subprocess.Popen", popen)
    monkeypatch.setattr("project.engine.ddp.child_command", lambda ckpt_path: ["python"])
    monkeypatch.setattr("project.engine.ddp.get_original_cwd", lambda: str(tmp_path))
    launcher = HydraJobLauncher(LightningEnvironment(), num_processes=num_processes, num_nodes=num_nodes)
    launcher.start_children(None)
    launcher.finish(failed=False)
    return started


def test_the_children_are_told_the_runs_world_size_and_their_node_and_local_rank(monkeypatch, tmp_path: Path):
    """As Lightning's own launcher tells them: WORLD_SIZE counts every process of the run, on every node (a user's
    code, torch's `env://` and libraries read it), LOCAL_RANK is each child's own."""
    started = children_started(monkeypatch, tmp_path, num_processes=3, num_nodes=2, node_rank=1)
    told = [
        (kwargs["env"]["WORLD_SIZE"], kwargs["env"]["NODE_RANK"], kwargs["env"]["LOCAL_RANK"]) for kwargs in started
    ]
    assert told == [("6", "1", "1"), ("6", "1", "2")]


@pytest.mark.parametrize(("platform", "asked"), [("linux", True), ("darwin", False), ("win32", False)])
def test_the_children_are_to_die_with_their_parent_where_linux_can_ask_it(monkeypatch, tmp_path: Path, platform, asked):
    """Linux's parent-death signal (test_waits.py sees it end a stuck rank) is asked for on Linux alone: elsewhere
    (a laptop's macOS) the children start without it, as `prctl` and `libc.so.6` are Linux's."""
    monkeypatch.setattr("project.engine.ddp.sys.platform", platform)
    started = children_started(monkeypatch, tmp_path, num_processes=2, num_nodes=1)
    assert [kwargs["preexec_fn"] is die_with_parent for kwargs in started] == [asked]
    assert asked or started[0]["preexec_fn"] is None


def test_differing_keys_names_nested_and_missing_keys():
    first = {"a": 1, "b": {"c": [1, 2], "d": 0}}
    assert differing_keys(first, {"a": 1, "b": {"c": [1, 3]}, "e": None}) == ["b.c", "b.d"]
    assert differing_keys(first, first) == []


def test_a_job_gives_back_the_threads_and_variables_its_launch_changed(monkeypatch: pytest.MonkeyPatch):
    """A single-process sweep job after a DDP job would otherwise run with the DDP job's one thread."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    threads = torch.get_num_threads()
    trainer = type("Trainer", (), {"strategy": type("Strategy", (), {"launcher": None})(), "loggers": []})()
    with isolated_job(trainer):
        torch.set_num_threads(max(1, threads // 2) if threads > 1 else 2)
        os.environ.update(OMP_NUM_THREADS="1", LOCAL_RANK="0")
    assert torch.get_num_threads() == threads
    assert "OMP_NUM_THREADS" not in os.environ and "LOCAL_RANK" not in os.environ


class LoggerThatCannotFinish:
    """A logger whose last write fails (its disk gone, its server down): what it was told the job ended as."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def finalize(self, status: str) -> None:
        self.told.append(status)
        raise OSError("the logger's server is gone")


def ended_job(**trainer: object) -> object:
    """What `isolated_job` reads of a Trainer whose job ends before any checkpoint, on one process."""
    strategy = trainer.pop("strategy", launched_by(None))
    plain = {"strategy": strategy, "loggers": [], "checkpoint_callbacks": [], "datamodule": None, "current_epoch": 0}
    return type("Trainer", (), plain | trainer)()


def test_a_logger_that_cannot_finish_fails_a_finished_job_and_not_over_a_failed_ones_error():
    logger = LoggerThatCannotFinish()
    with pytest.raises(OSError, match="the logger's server is gone"), isolated_job(ended_job(loggers=[logger])):
        pass
    with pytest.raises(ValueError, match="the job's own"), isolated_job(ended_job(loggers=[logger])):
        raise ValueError("the job's own")
    assert logger.told == ["success", "failed"]


def test_a_sys_exit_inside_a_job_keeps_its_status_unless_lightning_ended_it_for_ctrl_c():
    """Lightning's Ctrl-C handling ends the run with sys.exit(1) after setting `interrupted`; any other exit (the
    user's own code) is theirs to keep."""
    with pytest.raises(SystemExit) as exited, isolated_job(ended_job(interrupted=False)):
        sys.exit(3)
    assert exited.value.code == 3
    with pytest.raises(RunStopped) as stopped, isolated_job(ended_job(interrupted=True)):
        sys.exit(1)
    assert stopped.value.exit_status == 128 + signal.SIGINT
    assert str(stopped.value) == "interrupted by the user (Ctrl-C): it had written no checkpoint yet: run it again"


def test_a_sigterm_noted_on_any_rank_after_fit_stops_the_job_there_in_one_line(tmp_path: Path):
    """Between fit and test (and after test) the ranks ask each other whether SIGTERM reached one of them, as no
    training step is left to agree on it; here on a group of this process alone, which the job's end takes down."""
    with one_rank_process_group(tmp_path):
        strategy = HydraDDPStrategy()
        strategy.sigterm_agreement = DeferredAgreement(size=1)
        trainer = ended_job(strategy=strategy, current_epoch=2)
        stop_if_signalled(trainer)  # none noted: the job goes on
        strategy.sigterm_pending = True
        with pytest.raises(RunStopped) as stopped, isolated_job(trainer):
            stop_if_signalled(trainer)
        assert not dist.is_initialized(), "the job's end takes its process group down, for the next job's"
    assert stopped.value.exit_status == 128 + signal.SIGTERM
    assert str(stopped.value) == "stopped by SIGTERM in epoch 2: it had written no checkpoint yet: run it again"


@pytest.mark.parametrize(("rank", "said"), [("1", False), ("0", True)])
@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C"])
def test_a_stop_that_reaches_every_rank_is_said_by_rank_0_alone(
    stop: str, rank: str, said: bool, lightning_rank: Callable[[str], None], capsys
):
    """A scheduler's SIGTERM and a terminal's Ctrl-C reach every rank of the run at once: each rank stops with the
    signal's status, and rank 1's line would only repeat rank 0's (Lightning's launcher started it, RANK alone)."""
    lightning_rank(rank)

    @exit_on_user_error
    def job() -> None:
        with isolated_job(ended_job(interrupted=True, current_epoch=2)):
            if stop == "SIGTERM":
                raise SIGTERMException
            sys.exit(1)  # Lightning's, on Ctrl-C

    with pytest.raises(SystemExit) as ended:
        job()
    assert ended.value.code == 128 + (signal.SIGTERM if stop == "SIGTERM" else signal.SIGINT)
    line = "stopped by SIGTERM in epoch 2" if stop == "SIGTERM" else "interrupted by the user (Ctrl-C)"
    assert capsys.readouterr().err.startswith(f"error: {line}: ") is said


# What a collective says where another rank has died: gloo's one line, and NCCL's several.
GLOO_LOST_PEER = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:31669. This is "
    "typically caused by a remote worker crashing. Check the logs of the remote worker before reporting an error."
)
NCCL_LOST_PEER = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote process exited or there "
    "was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error or a "
    "remote process exiting prematurely.\nLast error:\nNET/Socket : socket closed"
)


@pytest.mark.parametrize("said", [GLOO_LOST_PEER, NCCL_LOST_PEER], ids=["gloo", "nccl"])
def test_a_rank_whose_collective_lost_another_rank_stops_in_one_line_with_the_backends_first(said: str, tmp_path: Path):
    """Under torchrun and srun no rank is the others' parent: a rank left behind names what its backend said, on one
    line (NCCL's message runs on for several), and ends with status 1, as docs/torchrun.md gives."""
    with one_rank_process_group(tmp_path), pytest.raises(RunStopped) as stopped, isolated_job(ended_job()):
        raise RuntimeError(said)
    assert stopped.value.exit_status == 1
    first_line = said.splitlines()[0]
    assert str(stopped.value) == (
        f"another rank of the run is gone ({first_line}); it had written no checkpoint yet: run it again"
    )


def test_a_rank_that_dies_as_rank_zeros_collective_breaks_is_named_not_the_collective():
    """A rank killed mid-step (out of memory, `kill -9`) breaks rank 0's collective a moment before rank 0 can see it
    dead: rank 0's job gives its children a second, so that the line names the rank and how it ended."""
    launcher = HydraJobLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    dying = subprocess.Popen(["sh", "-c", "read line; sleep 0.1; exit 3"], stdin=subprocess.PIPE)
    launcher.procs.append(dying)
    with pytest.raises(UserError) as stopped, isolated_job(ended_job(strategy=launched_by(launcher))):
        dying.stdin.close()  # it starts to end: its connections are closed, its exit not yet seen
        raise RuntimeError(GLOO_LOST_PEER)
    assert re.fullmatch(r"rank 1 \(pid \d+\) exited with code 3: the run stops", str(stopped.value))


def launched_by(launcher: HydraJobLauncher | None) -> object:
    """A strategy whose launcher started the run's other ranks (None: a single process), as `isolated_job` reads it."""
    return type("Strategy", (), {"launcher": launcher})()


@pytest.mark.slow
def test_results_from_best_reports_and_tests_the_best_checkpoint(tmp_path: Path, mnist_root: Path):
    args = mnist_overrides(mnist_root, "trainer.max_epochs=3", "data.batch_size=50", "model.optimizer.lr=0.05")
    check_ok(run_module("project.train", *args, "results_from=best", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
    results = read_json(tmp_path / "run" / "results.json")
    best = torch.load(results["weights"], weights_only=False)
    assert Path(results["weights"]).name.startswith("best-epoch")
    score = next(v for k, v in best["callbacks"].items() if "'monitor': 'val/acc'" in k)["best_model_score"]
    assert results["val/acc"] == pytest.approx(float(score), abs=1e-6)
    check_ok(run_module("project.evaluate", f"ckpt_path={results['weights']}", cwd=tmp_path))


def test_results_from_best_without_a_best_checkpoint_is_refused(tmp_path: Path):
    result = run_module(
        "project.train", "results_from=best", "callbacks=none", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: results_from=best needs the best checkpoint")
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_sweep_job_after_a_ddp_job_keeps_every_thread(tmp_path: Path):
    """`-m trainer=ddp,cpu`: the second job's torch thread count is the machine's, not the DDP job's."""
    script = (
        "import torch, lightning as L\n"
        "class Threads(L.Callback):\n"
        "    def on_train_start(self, trainer, module):\n"
        "        print(f'threads={torch.get_num_threads()} world={trainer.world_size}', flush=True)\n"
    )
    (tmp_path / "thread_probe.py").write_text(script)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env_without_omp = {key: value for key, value in environment().items() if key != "OMP_NUM_THREADS"}
    result = subprocess.run(
        [
            python(),
            "-m",
            "project.train",
            "-m",
            "trainer=ddp,cpu",
            "logger=none",
            "+callbacks.probe._target_=thread_probe.Threads",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env_without_omp, **env, "PYTHONUNBUFFERED": "1"},
    )
    check_ok(result)
    probes = re.findall(r"threads=\d+ world=\d+", result.stdout)  # lines shared with the progress bar
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        env=env_without_omp,
        check=True,
    )
    assert probes[0] == "threads=1 world=2" and probes[-1] == f"threads={fresh.stdout.strip()} world=1", probes


@pytest.mark.slow
def test_a_ddp_training_step_issues_no_collective_of_its_own_and_agrees_on_sigterm_beside_it(tmp_path: Path):
    """DDP's bucket all-reduce is issued from C++, outside the count: per step the training group carries nothing
    the project or Lightning add, and the SIGTERM agreement is one all-reduce on its own CPU group. Steps after an
    epoch's first; the divergence check, which gathers at logging steps only, is out of the way."""
    run_dir = tmp_path / "run"
    toy = ["trainer=ddp", "trainer.devices=2", "data.batch_size=1", "logger=none", "trainer.log_every_n_steps=100"]
    env = {"PYTHONPATH": str(REPO)}  # lets the run import tests.collective_counter
    check_ok(
        run_module(
            "project.train", *toy, *count_collectives(run_dir), f"hydra.run.dir={run_dir}", cwd=tmp_path, env=env
        )
    )
    for rank in (0, 1):
        assert read_json(run_dir / f"collectives.rank{rank}.json") == [{"agreement": {"allreduce": 1}}] * 6
