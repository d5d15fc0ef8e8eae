"""The one `error:` line the engine writes for a failure a user can cause, built from the error itself
(project/engine/errors.py); the processes that end on them are tested in tests/test_faults.py."""

import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from omegaconf import OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError
from torch.multiprocessing.spawn import ProcessRaisedException

from project.engine.errors import (
    ERROR_FILE,
    RunStopped,
    UserError,
    collective_timed_out,
    disk_refuses,
    error_line,
    exit_on_user_error,
    find_user_error,
    loader_timed_out,
    lost_a_loader_worker,
    quoted,
    run_hydra_app,
    unwritable,
)
from project.engine.upstream import VERSION_BASE, register_resolver
from tests.foreign_modules import RegressionData, RegressionModule
from tests.helpers import CONF_DIR, held_by_hydra


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    return checkpoints_kept_in(tmp_path / "run")


def checkpoints_kept_in(run_dir: Path) -> Path:
    """The run's checkpoints folder, holding a last.ckpt."""
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"")
    return folder


def with_free_space(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    """Every disk as `shutil.disk_usage` reports it, with `free` bytes free."""
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=free))


@pytest.mark.parametrize(
    ("error_number", "free", "detail", "why"),
    [
        (errno.EDQUOT, 1 << 30, "", "the disk quota of {checkpoints} is used up: make room there, or"),
        (errno.EIO, 1 << 30, "Input/output\n error", "Input/output error:"),
        # torch.save's own report of a full disk carries no error number: the free space tells.
        (
            None,
            (1 << 20) - 1,
            "file write failed",
            "no space left on the disk of {checkpoints} (1048575 bytes free): make room there, or",
        ),
        (None, 1 << 20, "file write failed", "file write failed:"),
        (
            errno.EROFS,
            1 << 30,
            "file write failed",
            "{checkpoints} cannot be written (a read-only disk, or no permission): make it writable, or",
        ),
        # An encrypted folder whose key was removed: numbered above the quota's and the read-only disk's, neither.
        (errno.ENOKEY, 1 << 30, "Required key not available", "Required key not available:"),
    ],
    ids=["over-its-quota", "another-reason", "under-a-mebibyte-free", "a-mebibyte-free", "read-only", "key-removed"],
)
def test_a_write_the_disk_refused_is_named_with_why_and_the_checkpoints_kept(
    checkpoints: Path, monkeypatch: pytest.MonkeyPatch, error_number: int | None, free: int, detail: str, why: str
):
    with_free_space(monkeypatch, free)
    line = error_line(unwritable(checkpoints / "epoch=1.ckpt", error_number, detail=detail))
    assert line == (
        f"error: could not write {checkpoints}/epoch=1.ckpt: {why.format(checkpoints=checkpoints)} write the run "
        "elsewhere (hydra.run.dir); kept: last.ckpt"
    )


def test_memory_running_out_in_torchs_cpu_allocator_says_how_much_was_asked_for_in_gib():
    """torch 2.14's CPU allocator, in its own words (as `torch.empty(2**45)` says it), counts bytes; the line gives
    GiB, as CUDA's own message does."""
    refused = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 1610612736 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert error_line(refused) == (
        "error: out of memory (1.5 GiB asked for): lower the batch size or the model's size, or run where there is "
        "more memory"
    )


def load_yaml(path: Path) -> None:
    with path.open() as file:
        yaml.safe_load(file)


def refuse_unmarked(path: Path) -> None:
    """A YAML error that says no place (PyYAML's errors may leave it out)."""
    raise yaml.MarkedYAMLError(problem="found a tab")


@pytest.mark.parametrize(
    ("main", "line"),
    [
        (
            load_yaml,
            "error: {broken}, line 4, column 6 is not valid YAML (while parsing a flow sequence: expected ',' or ']', "
            "but got ':'): correct the file",
        ),
        (
            refuse_unmarked,
            "error: a config file is not valid YAML (found a tab): correct the file",
        ),
    ],
    ids=["where-the-parser-stopped", "nowhere-said"],
)
def test_a_config_file_that_is_not_valid_yaml_is_one_line_naming_where_it_is_broken(
    main, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """Lines and columns counted from 1, as an editor counts them (the parser counts from 0)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # run_hydra_app sets it; the test leaves it as it was
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\nwidth: 3\nlayers: [1, 2\ndepth: 5\n")
    with pytest.raises(SystemExit) as ended:
        run_hydra_app(lambda: main(broken))
    assert ended.value.code == 2
    assert capsys.readouterr().err == line.format(broken=broken) + "\n"


@pytest.mark.parametrize(
    ("free", "writable", "refuses"),
    [(1 << 30, True, False), (1 << 20, True, False), ((1 << 20) - 1, True, True), (1 << 30, False, True)],
    ids=["a-gibibyte-free", "a-mebibyte-free", "under-a-mebibyte", "not-writable"],
)
def test_a_failed_write_that_said_no_error_number_is_the_disks_where_the_disk_is_full_or_not_writable(
    checkpoints: Path, monkeypatch: pytest.MonkeyPatch, free: int, writable: bool, refuses: bool
):
    """torch.save's RuntimeError says no error number: the disk is asked, and where it has room and may be written
    the failure is not the disk's (a checkpoint that cannot be pickled keeps its traceback)."""
    with_free_space(monkeypatch, free)
    monkeypatch.setattr(os, "access", lambda path, mode: writable)
    assert disk_refuses(checkpoints / "epoch=1.ckpt") is refuses


def test_an_os_error_of_a_full_disk_is_the_users_whichever_writer_met_it(checkpoints: Path):
    written = checkpoints / "events.out"
    try:
        raise RuntimeError("the logger failed") from OSError(errno.ENOSPC, "No space left on device", str(written))
    except RuntimeError as error:
        found = find_user_error(error)
    assert isinstance(found, UserError) and "no space left on the disk of" in str(found)


def test_an_error_raised_in_a_dataloader_worker_is_its_message_without_the_workers_traceback():
    """PyTorch re-raises a worker's exception with the worker's traceback in its message."""
    message = (
        "Caught UserError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in fetch\nUserError: data.root=/data: no images   there'
    )
    assert error_line(UserError(message)) == "error: data.root=/data: no images there"


def test_an_error_that_is_not_the_users_is_its_type_and_message_on_one_line():
    assert error_line(KeyError("weights")) == "error: KeyError: 'weights'"


def test_a_bug_that_python_reports_over_several_lines_is_its_last_the_exception_itself():
    """A SyntaxError (a module of the user's that does not parse) is reported with its file, code and caret first."""
    with pytest.raises(SyntaxError) as failed:
        compile("width = (3,\n", "my_model.py", "exec")
    assert error_line(failed.value) == "error: SyntaxError: '(' was never closed"


def refuse_the_value(value: int) -> None:
    raise UserError(f"${{refusing:{value}}}: {value} gives no step: set a positive number of epochs")


@pytest.fixture
def refusing_resolver() -> Iterator[None]:
    """`${refusing:...}`: a resolver that refuses its value with a UserError, as the project's own may."""
    register_resolver("refusing", refuse_the_value)
    try:
        yield
    finally:
        OmegaConf.clear_resolver("refusing")


@pytest.mark.usefixtures("refusing_resolver")
def test_a_resolvers_refusal_behind_omegaconfs_errors_is_its_own_line():
    """OmegaConf wraps a resolver's exception in an error it raises while handling its own (the refusal is only the
    implicit context of the error that reaches the entry point)."""
    config = OmegaConf.create({"scheduler": {"total_steps": "${refusing:0}"}})
    with pytest.raises(InterpolationResolutionError) as failed:
        OmegaConf.to_container(config, resolve=True)
    assert error_line(failed.value) == "error: ${refusing:0}: 0 gives no step: set a positive number of epochs"


def test_a_value_naming_no_key_of_the_config_is_named_by_its_own_key():
    config = OmegaConf.create({"data": {"batch_size": "${oops.size}"}})
    with pytest.raises(InterpolationResolutionError) as failed:
        OmegaConf.to_container(config, resolve=True)
    assert error_line(failed.value) == (
        "error: data.batch_size: Interpolation key 'oops.size' not found: point the ${...} at a key the config has "
        "(--cfg job prints the config unresolved), or give the value itself"
    )


def test_torchs_word_of_a_killed_loader_worker_is_a_lost_worker():
    assert lost_a_loader_worker(RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. "))
    assert not lost_a_loader_worker(RuntimeError("CUDA error: an illegal memory access was encountered"))


class RefusingImages(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError(f"image {index} is not an image")


def test_a_bug_met_in_the_loader_or_a_broken_connection_elsewhere_is_no_lost_worker():
    """Only a broken connection inside torch's DataLoader is a worker that died handing over a batch."""
    with pytest.raises(ValueError) as failed:
        next(iter(torch.utils.data.DataLoader(RefusingImages())))
    assert not lost_a_loader_worker(failed.value)
    assert not lost_a_loader_worker(ConnectionResetError("the tracking server closed the connection"))


def test_only_torchs_word_of_a_loader_that_sent_nothing_in_time_is_a_loader_timeout():
    assert loader_timed_out(RuntimeError("DataLoader timed out after 5 seconds"))
    assert not loader_timed_out(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_a_collectives_words_outside_a_process_group_are_no_timeout():
    """A library's own "Timed out waiting" (a lock, a server) where this process is in no group of ranks."""
    assert not collective_timed_out(RuntimeError("Timed out waiting for the lock on the study"))


def test_a_user_error_a_spawned_worker_raised_is_its_one_line_and_exit_status():
    """ddp_spawn's parent gets only the worker's traceback, as text: the user error in it is rebuilt, chained
    exceptions before it ignored; a bug's traceback stays a bug."""
    worker = (
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\ntorch.distributed.DistBackendError: an earlier one\n\n'
        "The above exception was the direct cause of the following exception:\n\n"
        'Traceback (most recent call last):\n  File "y.py", line 2, in g\n'
        "project.engine.history.Diverged: training diverged at step 3 (loss nan): lower the learning rate\n"
    )
    refusal = find_user_error(ProcessRaisedException(worker, 1, 123))
    assert error_line(refusal) == "error: training diverged at step 3 (loss nan): lower the learning rate"
    assert refusal.exit_status == UserError.exit_status
    bug = "\n\nTraceback (most recent call last):\n  File \"y.py\", line 2, in g\nKeyError: 'a bug'\n"
    assert find_user_error(ProcessRaisedException(bug, 0, 123)) is None


@pytest.mark.parametrize(
    "raised",
    [
        "no_such_package.errors.UserError: not importable",  # a module this process cannot import
        "project.engine.errors.NoSuchError: not in its module",  # a name its module lacks
        "omegaconf.errors.ConfigKeyError: Key 'x' is not in struct",  # an exception, but no user error
        "project.engine.errors.ERROR_FILE: not an exception",  # a name, but no class
    ],
)
def test_a_spawned_workers_traceback_naming_no_user_error_is_no_user_error(raised: str):
    worker = f'\n\nTraceback (most recent call last):\n  File "y.py", line 2, in g\n{raised}\n'
    assert find_user_error(ProcessRaisedException(worker, 0, 123)) is None


def test_a_lightning_misconfiguration_a_spawned_worker_raised_is_its_line_with_a_user_errors_exit_status():
    worker = (
        '\n\nTraceback (most recent call last):\n  File "y.py", line 2, in g\n'
        "lightning.fabric.utilities.exceptions.MisconfigurationException: No `test_step()` method defined\n"
    )
    refusal = find_user_error(ProcessRaisedException(worker, 0, 123))
    assert error_line(refusal) == "error: No `test_step()` method defined"
    assert refusal.exit_status == UserError.exit_status


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    """A run's log file: a file handler of the root logger, as Hydra's job logging adds."""
    path = tmp_path / "train.log"
    handler = logging.FileHandler(path)
    logging.getLogger().addHandler(handler)
    try:
        yield path
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


@pytest.fixture
def sweep_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process as rank 0 of one job of a sweep (`-m`), as Hydra holds it; the job's output dir."""
    for variable in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(variable, raising=False)
    output_dir = tmp_path / "sweep" / "0"
    output_dir.mkdir(parents=True)
    overrides = ["hydra.mode=MULTIRUN", f"run_dir={tmp_path}", f"hydra.sweep.dir={tmp_path}/sweep"]
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    cfg.hydra.runtime.output_dir = str(output_dir)
    with held_by_hydra(cfg):
        yield output_dir


@exit_on_user_error
def buggy_job() -> None:
    raise KeyError("weights")


def test_a_bug_outside_a_sweep_raises_with_its_traceback_in_the_log_file_too(log_file: Path, capsys):
    with pytest.raises(KeyError):
        buggy_job()
    log = log_file.read_text()
    assert log.startswith("Traceback (most recent call last):") and "in buggy_job" in log
    assert log.rstrip().endswith("KeyError: 'weights'")
    assert capsys.readouterr().err == "", "the traceback is Python's to print, once"


def test_a_bug_in_a_sweeps_job_fails_that_job_alone(sweep_job: Path, log_file: Path, capsys):
    """Its traceback on the console and in the log, its line in the job's error.txt for the sweep's table; the
    sweep goes on to the next job."""
    assert buggy_job() is None
    stderr = capsys.readouterr().err
    assert "in buggy_job" in stderr and stderr.splitlines()[-1] == "error: KeyError: 'weights'"
    assert (sweep_job / ERROR_FILE).read_text() == "error: KeyError: 'weights'\n"
    log = log_file.read_text()
    assert "in buggy_job" in log and log.rstrip().endswith("error: KeyError: 'weights'")


@pytest.mark.parametrize("name", ["tensorboard/events.out.tfevents.1765000000.node1.4242.0", "train.log"])
def test_a_run_file_the_disk_refuses_names_the_checkpoints_the_run_kept(sweep_job: Path, name: str):
    """A file of the run that is not a checkpoint (TensorBoard's events, named as its writer names them; the log):
    the run dir's checkpoints are kept."""
    checkpoints_kept_in(sweep_job)
    line = error_line(unwritable(sweep_job / name, errno.EIO, detail="Input/output error"))
    assert line == (
        f"error: could not write {sweep_job / name}: Input/output error: write the run elsewhere (hydra.run.dir); "
        "kept: last.ckpt"
    )


def test_a_checkpoint_written_outside_the_run_names_the_checkpoints_of_its_own_folder(sweep_job: Path, tmp_path: Path):
    """A ModelCheckpoint of the user's with a dirpath of its own: that folder's checkpoints are the ones kept."""
    checkpoints_kept_in(sweep_job)
    elsewhere = tmp_path / "best"
    elsewhere.mkdir()
    (elsewhere / "epoch=1.ckpt").write_bytes(b"")
    line = error_line(unwritable(elsewhere / "epoch=2.ckpt", errno.EIO, detail="Input/output error"))
    assert line.endswith("(hydra.run.dir); kept: epoch=1.ckpt"), line


@exit_on_user_error
def refused_job() -> None:
    raise UserError("data.root=/nowhere: no such dir")


def test_a_sweep_jobs_error_file_is_rank_0s_alone(
    sweep_job: Path, log_file: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """Every rank of a DDP job says its line; only rank 0 writes the job's error.txt, which the sweep's table reads
    (another rank's line may differ: it would overwrite rank 0's)."""
    monkeypatch.setenv("RANK", "1")
    assert refused_job() is None, "the sweep goes on to its next job"
    assert capsys.readouterr().err.splitlines()[-1] == "error: data.root=/nowhere: no such dir"
    assert not (sweep_job / ERROR_FILE).exists()
    monkeypatch.setenv("RANK", "0")
    assert refused_job() is None
    assert (sweep_job / ERROR_FILE).read_text() == "error: data.root=/nowhere: no such dir\n"


@exit_on_user_error
def stopped_rank() -> None:
    raise RunStopped("stopped by SIGTERM in epoch 2: resume with ckpt_path=last", 143, on_every_rank=True)


@pytest.mark.parametrize(("rank", "said"), [("1", False), ("0", True)])
def test_a_stop_every_rank_meets_is_said_by_rank_0_and_logged_by_the_ranks_it_started(
    rank: str, said: bool, log_file: Path, lightning_rank: Callable[[str], None], capsys
):
    """Lightning's DDP launcher starts ranks 1.. from rank 0, whose line is the run's: theirs would repeat it."""
    lightning_rank(rank)
    with pytest.raises(SystemExit) as ended:
        stopped_rank()
    assert ended.value.code == 143
    line = "error: stopped by SIGTERM in epoch 2: resume with ckpt_path=last"
    assert capsys.readouterr().err == (f"{line}\n" if said else "")
    assert log_file.read_text().rstrip().endswith(line)


@exit_on_user_error
def rank_left_alone() -> None:
    raise RunStopped("another rank of the run is gone (Connection closed by peer); resume with ckpt_path=last", 1)


def test_a_stop_one_rank_meets_alone_is_said_by_that_rank(
    log_file: Path, lightning_rank: Callable[[str], None], capsys
):
    """Rank 0 may be the one gone: rank 1's line is then the only one."""
    lightning_rank("1")
    with pytest.raises(SystemExit) as ended:
        rank_left_alone()
    assert ended.value.code == 1
    assert capsys.readouterr().err.startswith("error: another rank of the run is gone")


@exit_on_user_error
def misconfigured_run() -> None:
    raise MisconfigurationException("`Trainer(limit_val_batches=-1)` must be an int or a float")


def test_a_lightning_misconfiguration_ends_the_run_in_its_line_with_a_user_errors_status(capsys):
    with pytest.raises(SystemExit) as ended:
        misconfigured_run()
    assert ended.value.code == UserError.exit_status
    assert capsys.readouterr().err == "error: `Trainer(limit_val_batches=-1)` must be an int or a float\n"


def test_a_stopped_sweep_job_ends_the_sweep_and_writes_no_error_file(sweep_job: Path, log_file: Path, capsys):
    """A stop (SIGTERM, Ctrl-C) is no failure of the job: the sweep ends with its status, to be carried on."""
    with pytest.raises(SystemExit) as ended:
        stopped_rank()
    assert ended.value.code == 143
    assert capsys.readouterr().err == "error: stopped by SIGTERM in epoch 2: resume with ckpt_path=last\n"
    assert not (sweep_job / ERROR_FILE).exists()


def raise_hydras(cause: BaseException | None) -> None:
    """Hydra's failure to merge an override, with the OmegaConf error behind it where there is one."""
    raise ConfigCompositionException("Error merging override trainer.devices=[0") from cause


@pytest.mark.parametrize(
    ("cause", "printed"),
    [
        (None, ""),
        (GrammarParseError("mismatched input '<EOF>' expecting ']'"), "mismatched input '<EOF>' expecting ']'\n"),
    ],
    ids=["alone", "with-omegaconfs-cause"],
)
def test_hydras_other_errors_print_as_hydra_prints_them_with_exit_1(
    cause: BaseException | None, printed: str, monkeypatch: pytest.MonkeyPatch, capsys
):
    """Not a typo the engine can name: Hydra's own message, then the OmegaConf error behind it where there is one."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as ended:
        run_hydra_app(lambda: raise_hydras(cause))
    assert ended.value.code == 1
    assert capsys.readouterr().err == "Error merging override trainer.devices=[0\n" + printed


def raise_while_cleaning_up_after(error: BaseException) -> None:
    """A clean-up that fails inside an `except` block without `from`: `error` is only its implicit `__context__`."""
    try:
        raise error
    except BaseException:
        raise RuntimeError("the clean-up failed too")  # noqa: B904 (without `from`: the case under test)


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/a/full/disk/last.ckpt"),
            "error: could not write /a/full/disk/",
        ),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "error: out of memory (2.00 GiB asked for): "),
        (UserError("data.root=/nowhere: no such dir"), "error: data.root=/nowhere: no such dir"),
    ],
    ids=["full-disk", "out-of-memory", "user-error"],
)
def test_a_user_error_behind_a_failed_clean_up_ends_in_its_line_not_a_traceback(error, line, capsys):
    entry_point = exit_on_user_error(raise_while_cleaning_up_after)
    with pytest.raises(SystemExit) as ended:
        entry_point(error)
    assert ended.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.splitlines()[-1].startswith(line) and "Traceback" not in stderr


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (torch.zeros(2, 3), "a tensor of shape [2, 3]"),
        ({"lr": 0.1}, "a mapping"),
        ([1, 2], "a list of 2"),
        ("x\x1b[2J", "'x\\x1b[2J'"),
        ("a" * 100, "'" + "a" * 66 + "..."),
        ("a" * 68, "'" + "a" * 68 + "'"),
    ],
)
def test_a_value_read_from_a_file_is_quoted_escaped_cut_or_named_by_its_kind(value, line):
    assert quoted(value, longest=70) == line


def test_a_value_read_from_a_file_is_quoted_in_at_most_60_characters_unless_asked_otherwise():
    assert quoted("a" * 58) == "'" + "a" * 58 + "'"
    assert quoted("a" * 59) == "'" + "a" * 56 + "..."


@pytest.mark.parametrize("name", ["EarlyStopping", "ModelCheckpoint"])
def test_a_callback_monitoring_a_metric_not_logged_names_those_logged(name: str, tmp_path: Path):
    """Lightning's own failure (a RuntimeError, a MisconfigurationException), as it meets it at the first
    validation, said as the best checkpoint says it for optimized_metric."""
    callback = EarlyStopping("val/msx") if name == "EarlyStopping" else ModelCheckpoint(tmp_path, monitor="val/msx")
    trainer = L.Trainer(max_epochs=1, callbacks=[callback], logger=False, enable_progress_bar=False)
    with pytest.raises(Exception) as failed:  # noqa: PT011
        trainer.fit(RegressionModule(), datamodule=RegressionData())
    assert error_line(find_user_error(failed.value)) == (
        f"error: the {name} callback's monitor=val/msx is not logged by the module (it logs: val/mse, train/mse): "
        "set its monitor (callbacks.<its name>.monitor in the config) to one of those, or log val/msx with self.log "
        "in the module"
    )
