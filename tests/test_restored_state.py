"""A checkpoint's restored state is data (project/engine/restored_state.py): resuming one, by any road, deletes,
opens and connects to nothing its callback states name outside the new run's dir, and a state this run's objects
cannot take ends the run in one line before it trains; the checkpoint reader and deleter refuse the same again
(`AtomicCheckpointIO`), and a sweep's results.json that is not a job's results fails that job in one line.

Each hostile path points at a victim outside the run (a directory with a file), or at a port of this test that notes
every connection: a run that followed it would delete the one or connect to the other (Lightning's `ModelCheckpoint`
deletes the file a restored state names as the previous best or last checkpoint, through fsspec, recursively).
"""

import json
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra import compose, initialize_config_dir

from project.engine.build import build
from project.engine.checkpoints import (
    AtomicCheckpointIO,
    check_shards,
    deletable,
    is_number,
    plain_checkpoint,
    unlike,
)
from project.engine.errors import UserError, error_line
from project.engine.run_dir import plain_path_inside
from project.engine.sweeps import finished_results, job_rows
from project.engine.upstream import VERSION_BASE
from tests.faults import ENV, START_TIMEOUT, SWEEP_FAILED, BadInput, assert_nothing_half_written, bad_input_test
from tests.helpers import CONF_DIR, proxied_to, run_module, watched_port

VICTIM_FILE = "the user's own file"


def lay_victim(directory: Path) -> Path:
    """`directory`/victim: a directory holding a file, which no run may delete."""
    victim = directory / "victim"
    victim.mkdir(parents=True, exist_ok=True)
    (victim / "file").write_text(VICTIM_FILE)
    return victim


def assert_victim_untouched(directory: Path) -> None:
    victim = directory / "victim" / "file"
    assert victim.is_file() and victim.read_text() == VICTIM_FILE, f"{victim.parent} was deleted"


# Each way a callback state names a place outside the run, given (the case's dir, where the victim lies; the new
# run's dir; the watched port). `~` is the case's dir: each run has its own HOME.
HOSTILE_PATHS: dict[str, Callable[[Path, Path, int], str]] = {
    "local-url": lambda case, run, port: f"local://{case}/victim",
    "file-url": lambda case, run, port: f"file://{case}/victim",
    "http": lambda case, run, port: f"http://127.0.0.1:{port}/victim",
    "s3": lambda case, run, port: "s3://a-bucket/victim",
    "dot-dot": lambda case, run, port: f"{run}/checkpoints/../../victim",
    "absolute": lambda case, run, port: f"{case}/victim",
    "symlink": lambda case, run, port: f"{run}/checkpoints/link",
    "home": lambda case, run, port: "~/victim",
}


def plant_link(case: Path, run: Path) -> None:
    """`<run>/checkpoints/link`, a symbolic link inside the new run's dir to the victim outside it (there before the
    run starts)."""
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run / "checkpoints" / "link").symlink_to(case / "victim")


def with_hostile_paths(checkpoint: Path, written: Path, path: str | list[str], run: Path) -> Path:
    """`checkpoint` with `path` in every path of its ModelCheckpoint states (each's previous best and last file,
    its worst best one, which a better epoch deletes), their dir the new run's (so Lightning restores them all); given
    several paths, the first three are its best, worst best and last files, and all of them its best ones."""
    paths = [path] if isinstance(path, str) else path
    content = torch.load(checkpoint, map_location="cpu", weights_only=True)
    for state in content["callbacks"].values():
        if "best_model_path" in state:
            state.update(
                dirpath=str(run / "checkpoints"),
                best_model_path=paths[0],
                kth_best_model_path=paths[1 % len(paths)],
                last_model_path=paths[2 % len(paths)],
                best_k_models=dict.fromkeys(paths, torch.tensor(-1.0)),
                best_model_score=torch.tensor(-1.0),
                kth_value=torch.tensor(-1.0),
            )
    written.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, written)
    return written


# The rule.


@pytest.mark.parametrize("form", HOSTILE_PATHS)
def test_a_path_is_the_runs_only_plainly_inside_its_dir(form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Links and `..` followed as the kernel follows them, `~` never expanded, a URL never a path."""
    monkeypatch.setenv("HOME", str(tmp_path))
    lay_victim(tmp_path)
    run = tmp_path / "run"
    plant_link(tmp_path, run)
    assert not plain_path_inside(HOSTILE_PATHS[form](tmp_path, run, 1), run)
    assert plain_path_inside(f"{run}/checkpoints/best.ckpt", run)
    assert plain_path_inside(f"{run}/checkpoints/../last.ckpt", run)


# In this process: the state a resume restores (fast; the same as users meet it, in processes, further down).


def trained_or_resumed(run_dir: Path, *overrides: str) -> L.Trainer:
    """What project.train builds for `overrides` (the toy, on the CPU, no logger), fitted in this process."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=["logger=none", "trainer=cpu", *overrides, f"run_dir={run_dir}"])
    setup = build(cfg, run_dir.parent / "outputs")
    setup.trainer.fit(setup.module, datamodule=setup.datamodule, ckpt_path=setup.ckpt_path)
    return setup.trainer


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last.ckpt of a toy run of 2 epochs, trained in this process."""
    run_dir = tmp_path_factory.mktemp("two-epochs") / "run"
    trained_or_resumed(run_dir, "trainer.max_epochs=2")
    return run_dir / "checkpoints" / "last.ckpt"


def checkpoint_states(trainer: L.Trainer) -> list[dict]:
    return [callback.state_dict() for callback in trainer.checkpoint_callbacks]


def paths_of(state: dict) -> list[str]:
    """The paths a ModelCheckpoint's state names."""
    named = [state[key] for key in ("dirpath", "best_model_path", "kth_best_model_path", "last_model_path")]
    return [path for path in [*named, *state["best_k_models"]] if path]


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning: ")]


@pytest.mark.parametrize("form", HOSTILE_PATHS)
def test_a_resume_drops_each_path_outside_the_run_before_a_callback_takes_it(
    form: str, tmp_path: Path, two_epochs: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """The states the callbacks hold once the resumed run has trained an epoch name only the run's own files, one
    warning line says what was dropped, and nothing outside the run was deleted or connected to."""
    monkeypatch.setenv("HOME", str(tmp_path))
    lay_victim(tmp_path)
    run = tmp_path / "run"
    plant_link(tmp_path, run)
    with watched_port() as (port, connections):
        for name, value in proxied_to(port).items():
            monkeypatch.setenv(name, value)
        path = HOSTILE_PATHS[form](tmp_path, run, port)
        hostile = with_hostile_paths(two_epochs, tmp_path / "hostile.ckpt", path, run)
        trainer = trained_or_resumed(run, f"ckpt_path={hostile}", "trainer.max_epochs=3")
    assert trainer.current_epoch == 3
    held = [path for state in checkpoint_states(trainer) for path in paths_of(state)]
    assert held and all(plain_path_inside(path, run) for path in held), held
    (warning,) = warnings_in(capsys.readouterr().err)
    assert warning.startswith(f"warning: ckpt_path={hostile}: its callback states name files outside this run's dir")
    assert repr(path) in warning and "never opened or deleted" in warning
    assert_victim_untouched(tmp_path)
    assert connections == []


def test_the_warning_quotes_the_first_three_paths_dropped_and_counts_the_others(
    tmp_path: Path, two_epochs: Path, capsys: pytest.CaptureFixture
):
    """Nine paths outside the run, each in its best checkpoints: one line quotes three and says `and 6 more` (of
    seven, `and 4 more` reads the same with `7 ^ 3`)."""
    run = tmp_path / "run"
    paths = [str(tmp_path / f"elsewhere-{index}.ckpt") for index in range(9)]
    hostile = with_hostile_paths(two_epochs, tmp_path / "hostile.ckpt", paths, run)
    trained_or_resumed(run, f"ckpt_path={hostile}", "trainer.max_epochs=3")
    (warning,) = warnings_in(capsys.readouterr().err)
    assert f"({', '.join(map(repr, paths[:3]))} and 6 more)" in warning, warning


def moved_run(source: Path, run: Path) -> dict:
    """A copy of the run dir `source` as `run`, its checkpoint's paths its own, as if it had trained there; the
    BestCheckpoint state of its last.ckpt."""
    shutil.copytree(source, run)
    last = run / "checkpoints" / "last.ckpt"
    content = torch.load(last, weights_only=True)
    for state in [state for state in content["callbacks"].values() if "best_model_path" in state]:
        for key in ("dirpath", "best_model_path", "kth_best_model_path", "last_model_path"):
            state[key] = state[key] and state[key].replace(str(source), str(run))
        state["best_k_models"] = {path.replace(str(source), str(run)): s for path, s in state["best_k_models"].items()}
    torch.save(content, last)
    return model_checkpoint_state(content)


def best_files(run: Path) -> list[str]:
    return sorted(path.name for path in (run / "checkpoints").glob("best-*.ckpt"))


def test_a_run_carried_on_in_its_own_dir_keeps_its_best_and_last_checkpoints(
    tmp_path: Path, two_epochs: Path, capsys: pytest.CaptureFixture
):
    """A requeued Slurm job, a carried-on sweep job, `hydra.run.dir=<dir> ckpt_path=last`: the paths are its own. Its
    best (epoch 0's perfect accuracy) stays the best, so a resumed epoch writes no other."""
    run = tmp_path / "run"
    best = moved_run(two_epochs.parent.parent, run)
    trainer = trained_or_resumed(run, "ckpt_path=last", "trainer.max_epochs=3")
    assert trainer.current_epoch == 3
    assert warnings_in(capsys.readouterr().err) == []
    assert trainer.checkpoint_callback.best_model_path == best["best_model_path"]
    assert best_files(run) == [Path(best["best_model_path"]).name]


# A state this run's objects cannot take: one line, before anything trains.


def edited(edit: Callable[[dict], None]) -> Callable[[Path, Path], Path]:
    def write(checkpoint: Path, written: Path) -> Path:
        content = torch.load(checkpoint, map_location="cpu", weights_only=True)
        edit(content)
        torch.save(content, written)
        return written

    return write


def group(content: dict) -> dict:
    return content["optimizer_states"][0]["param_groups"][0]


def model_checkpoint_state(content: dict) -> dict:
    return next(state for key, state in content["callbacks"].items() if key.startswith("BestCheckpoint"))


def training_order_state(content: dict) -> dict:
    return next(state for key, state in content["callbacks"].items() if key.startswith("TrainingOrder"))


# A position in the engine's training order (`TrainingOrder`), of every key but the training samples' count.
POSITION_WITHOUT_SAMPLES = {"epoch": 1, "batches_done": 0, "batch_size": 8, "processes": 1, "seed": 123}


POSITION_KEY = "epoch\x1b[2J"  # a terminal's "clear the screen", which the line must show as text
MALFORMED: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "lr-a-string": (
        edited(lambda c: group(c).update(lr="fast")),
        "its optimizer_states[0]['param_groups'][0]['lr'] holds 'fast', not a number",
    ),
    "a-group-of-other-parameters": (
        edited(lambda c: group(c).update(params=[0, 1])),
        "its optimizer_states[0]['param_groups'][0] holds 2 parameters, this run's group 6",
    ),
    "no-optimizer-state": (
        edited(lambda c: c.pop("optimizer_states")),
        "its optimizer_states has none, not a list of states (a checkpoint of the weights alone?)",
    ),
    "a-loop-key-missing": (
        edited(lambda c: c["loops"]["fit_loop"]["epoch_progress"].pop("total")),
        "its loops['fit_loop']['epoch_progress'] has no 'total'",
    ),
    "no-fit-loop": (edited(lambda c: c["loops"].pop("fit_loop")), "its loops has no 'fit_loop'"),
    "a-count-a-string": (
        edited(lambda c: c["loops"]["fit_loop"]["epoch_progress"]["total"].update(completed="2")),
        "its loops['fit_loop']['epoch_progress']['total']['completed'] holds '2', not a number",
    ),
    "callbacks-a-list": (edited(lambda c: c.update(callbacks=["x"])), "its callbacks hold a list of 1"),
    "no-lightning-version": (
        edited(lambda c: c.pop("pytorch-lightning_version")),
        "its pytorch-lightning_version holds None, not the version that wrote it",
    ),
    "a-best-score-a-string": (
        edited(lambda c: model_checkpoint_state(c).update(best_model_score="high")),
        "its callbacks[BestCheckpoint]['best_model_score'] holds 'high', not a score",
    ),
    "a-best-path-a-number": (
        edited(lambda c: model_checkpoint_state(c).update(best_model_path=7)),
        "its callbacks[BestCheckpoint]['best_model_path'] holds 7, not a path",
    ),
    "a-position-key-unknown": (
        edited(lambda c: c["ToyDataModule"]["position"].update({POSITION_KEY: 1})),
        "ckpt_path: the checkpoint's position in the training order (its data module's state) has a key no "
        "position has, 'epoch\\x1b[2J'",
    ),
    "a-position-count-a-string": (
        edited(lambda c: c["ToyDataModule"]["position"].update(batches_done="1")),
        "the checkpoint's position in the training order (its data module's state) holds batches_done='1', not a count",
    ),
    "training-order-data-a-key-missing": (
        edited(lambda c: training_order_state(c)["data"].pop("classes")),
        "the checkpoint's training order (its TrainingOrder state) names its data as a mapping, which is not one",
    ),
    "training-order-position-a-key-missing": (
        edited(lambda c: training_order_state(c).update(position=POSITION_WITHOUT_SAMPLES)),
        "the checkpoint's training order (its TrainingOrder state) holds the position a mapping, which is not one",
    ),
    "class-names-not-names": (
        edited(lambda c: c["ToyDataModule"].update(class_names={"0": 1})),
        "ckpt_path: the checkpoint's state of ToyDataModule is not one it wrote (its class_names hold a mapping)",
    ),
}


def test_a_number_read_from_a_checkpoint_is_an_int_a_float_or_a_tensor_of_one_real_element():
    """What an optimizer's group or a loop may hold where a number is due: an empty tensor, a bool, a complex number,
    or more than one element would fail in Lightning's restore or in the first step, in a traceback."""
    assert all(map(is_number, [1, 0.5, torch.tensor(0.5), torch.tensor([2])]))
    refused = [True, torch.tensor([]), torch.tensor([1.0, 2.0]), torch.tensor(True), torch.tensor(1j), "1", None]
    assert not any(map(is_number, refused))


@pytest.mark.parametrize("case", MALFORMED)
def test_a_state_this_runs_objects_cannot_take_is_one_line_before_training(case: str, tmp_path: Path, two_epochs: Path):
    make, named = MALFORMED[case]
    malformed = make(two_epochs, tmp_path / "malformed.ckpt")
    with pytest.raises(UserError) as raised:
        trained_or_resumed(tmp_path / "run", f"ckpt_path={malformed}", "trainer.max_epochs=3")
    line = error_line(raised.value)
    assert named in line, line
    assert "\x1b" not in line
    assert list((tmp_path / "run" / "checkpoints").glob("*")) == [], "it trained"


def test_a_schedule_state_is_compared_with_this_runs_schedule_value_by_value():
    """A rate that is a string where the schedule holds a number; a key only one side has is torch's to settle."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    fresh = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1).state_dict()
    assert unlike(dict(fresh), fresh, "lr_schedulers[0]", every_key=False) is None
    assert unlike({"step_size": 1}, fresh, "lr_schedulers[0]", every_key=False) is None
    stored = fresh | {"base_lrs": ["0.5"]}
    assert unlike(stored, fresh, "lr_schedulers[0]", every_key=False) == (
        "lr_schedulers[0]['base_lrs'][0] holds '0.5', not a number"
    )


# The reader and the deleter Lightning asks: a URL never read, nothing outside the run deleted.


@pytest.mark.parametrize("form", [form for form in HOSTILE_PATHS if form not in ("s3", "http")])
def test_the_checkpoint_io_deletes_nothing_outside_the_run(form: str, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    lay_victim(tmp_path)
    run = tmp_path / "run"
    plant_link(tmp_path, run)
    AtomicCheckpointIO(run).remove_checkpoint(HOSTILE_PATHS[form](tmp_path, run, 1))
    assert_victim_untouched(tmp_path)


def test_the_checkpoint_io_deletes_a_checkpoint_of_the_run_and_no_other_directory(tmp_path: Path):
    run = tmp_path / "run"
    checkpoint_io = AtomicCheckpointIO(run)
    checkpoint_io.save_checkpoint({"epoch": 0}, run / "checkpoints" / "best.ckpt")
    (run / "sharded.ckpt").mkdir()
    (run / "sharded.ckpt" / "meta.pt").write_bytes(b"")
    lay_victim(run)
    for path in ("checkpoints/best.ckpt", "sharded.ckpt", "victim"):
        checkpoint_io.remove_checkpoint(str(run / path))
    assert sorted(path.name for path in run.iterdir()) == ["checkpoints", "victim"]
    assert_victim_untouched(run)


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/best.ckpt", "local://{dir}/best.ckpt", "s3://b/best.ckpt"])
def test_the_checkpoint_io_reads_no_url(url: str, tmp_path: Path):
    refused = pytest.raises(UserError, match=r"is a URL: checkpoints are read from local files only")
    with watched_port() as (port, connections), refused:
        AtomicCheckpointIO(tmp_path).load_checkpoint(url.format(port=port, dir=tmp_path))
    assert connections == []


class TouchWhenUnpickled:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return Path.touch, (Path(self.path),)


def test_the_checkpoint_io_reads_as_data_whatever_it_is_asked(tmp_path: Path):
    """Lightning passes `weights_only=None` on, which torch.hub takes for False."""
    torch.save({"state_dict": TouchWhenUnpickled(tmp_path / "sentinel")}, tmp_path / "payload.ckpt")
    with pytest.raises(Exception, match="Weights only load failed"):
        AtomicCheckpointIO(tmp_path).load_checkpoint(tmp_path / "payload.ckpt", weights_only=False)
    assert not (tmp_path / "sentinel").exists()


def test_a_checkpoint_not_deleted_is_named_in_a_warning_with_its_control_characters_escaped(tmp_path, capsys):
    assert not deletable("/elsewhere/\x1b[2Jbest.ckpt", tmp_path)
    assert capsys.readouterr().err.strip() == (
        f"warning: /elsewhere/\\x1b[2Jbest.ckpt is outside this run's dir {tmp_path}: not deleted"
    )


# A sweep's results.json that is not a job's results.


@pytest.mark.parametrize(
    ("content", "problem"),
    [("[0.5]", "holds a list of 1, not a job's results"), ("{val/acc: 1", "is not JSON (Expecting property name")],
    ids=["a-list", "not-json"],
)
def test_a_results_json_that_is_not_a_jobs_results_fails_that_job_in_the_table(tmp_path: Path, content, problem):
    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (job / "results.json").write_text(content)
    line = f"{job / 'results.json'} {problem}"
    with pytest.raises(UserError, match=f"^{re.escape(line)}"):
        finished_results(job)
    (row,) = job_rows(tmp_path, "val/acc")
    assert row.error.startswith(f"error: {line}") and row.results is None


# The same as users meet them: project.train in processes of their own, each in its own working directory with its
# own HOME and TORCH_HOME, every HTTP(S) it might make (by proxy or not) sent to the watched port.


def own_environment(case: Path, port: int) -> dict[str, str]:
    return ENV | proxied_to(port) | {"HOME": str(case), "TORCH_HOME": str(case / "torch")}


def every_hostile_path(case: Path, ckpt: Path, port: int) -> list[str]:
    """`ckpt_path=<the finished run's last.ckpt naming every form of HOSTILE_PATHS>`, an epoch more (each form alone:
    `test_a_resume_drops_each_path_outside_the_run_before_a_callback_takes_it`, in this process)."""
    lay_victim(case)
    run = case / "run"
    plant_link(case, run)
    paths = [form(case, run, port) for form in HOSTILE_PATHS.values()]
    hostile = with_hostile_paths(ckpt, case / "hostile.ckpt", paths, run)
    return [f"hydra.run.dir={run}", f"ckpt_path={hostile}", "trainer.max_epochs=4"]


def planted_under_outputs(case: Path, ckpt: Path, port: int) -> list[str]:
    """`ckpt_path=last` takes the newest run under outputs/: one someone dropped there."""
    lay_victim(case)
    planted = case / "outputs" / "2026-12-05" / "12-00-00" / "checkpoints" / "last.ckpt"
    with_hostile_paths(ckpt, planted, f"local://{case}/victim", case / "run")
    return [f"hydra.run.dir={case / 'run'}", "ckpt_path=last", "trainer.max_epochs=4"]


def carried_on_sweep(case: Path, ckpt: Path, port: int) -> list[str]:
    """A sweep carried on in its dir: job 0 resumes its own last.ckpt, which here names the victim."""
    lay_victim(case)
    job = case / "sweep" / "0"
    with_hostile_paths(ckpt, job / "checkpoints" / "last.ckpt", f"{job}/checkpoints/../../../victim", job)
    return ["hydra.mode=MULTIRUN", f"hydra.sweep.dir={case / 'sweep'}", "trainer.max_epochs=4"]


def best_of_nothing_trained(case: Path, ckpt: Path, port: int) -> list[str]:
    """`results_from=best` of a resumed run that trains nothing more validates the best checkpoint its state names:
    here a URL, which Lightning would fetch and unpickle."""
    lay_victim(case)
    content = torch.load(ckpt, map_location="cpu", weights_only=True)
    model_checkpoint_state(content)["best_model_path"] = f"http://127.0.0.1:{port}/best.ckpt"
    torch.save(content, case / "hostile.ckpt")
    return [f"hydra.run.dir={case / 'run'}", f"ckpt_path={case / 'hostile.ckpt'}", "results_from=best"]


def requeued(case: Path, ckpt: Path, port: int) -> list[str]:
    """`hydra.run.dir=<dir> ckpt_path=last`, as a requeued Slurm job or a torchrun restart carries its run on."""
    moved_run(ckpt.parent.parent, case / "run")
    lay_victim(case)
    return [f"hydra.run.dir={case / 'run'}", "ckpt_path=last", "trainer.max_epochs=4"]


def sweep_of_unreadable_results(case: Path, ckpt: Path, port: int) -> list[str]:
    """A sweep carried on whose two jobs' results.json are a list and not JSON: neither is a finished job."""
    for job, content in (("0", "[0.5]"), ("1", "{val/acc: 1")):
        (case / "sweep" / job).mkdir(parents=True)
        (case / "sweep" / job / "results.json").write_text(content)
    return ["hydra.mode=MULTIRUN", f"hydra.sweep.dir={case / 'sweep'}", "seed=1,2"]


HOSTILE_ROADS: dict[str, Callable[[Path, Path, int], list[str]]] = {
    "ckpt_path-naming-every-form": every_hostile_path,
    "ckpt_path-last-planted-under-outputs": planted_under_outputs,
    "carried-on-sweep-job": carried_on_sweep,
    "results_from-best-of-a-url": best_of_nothing_trained,
}
ROADS = HOSTILE_ROADS | {
    "requeued-in-its-own-dir": requeued,
    "sweep-of-unreadable-results": sweep_of_unreadable_results,
}


@pytest.fixture(scope="module")
def roads(tmp_path_factory: pytest.TempPathFactory, finished_toy_run: Path) -> Iterator[dict]:
    """Every road's run, side by side (each mostly Python and Lightning starting up), each watched by a port of its
    own: the case's dir, its best checkpoints before the run, the run's result, and its port's connections."""
    with ExitStack() as ports, ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        started = {}
        for name, prepare in ROADS.items():
            case = tmp_path_factory.mktemp(name)
            port, connections = ports.enter_context(watched_port())
            arguments = ["logger=none", *prepare(case, finished_toy_run, port)]
            bests = best_files(case / "run") if (case / "run" / "checkpoints").is_dir() else []
            env = own_environment(case, port)
            future = pool.submit(run_module, "project.train", *arguments, cwd=case, timeout=START_TIMEOUT, env=env)
            started[name] = case, bests, future, connections
        yield {name: (case, bests, future.result(), seen) for name, (case, bests, future, seen) in started.items()}


def dropped_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "its callback states name files outside this run's dir" in line]


@pytest.mark.slow
@pytest.mark.parametrize("name", HOSTILE_ROADS)
def test_every_road_to_a_resume_goes_on_without_touching_what_its_state_names(name: str, roads: dict):
    case, _, result, connections = roads[name]
    assert_victim_untouched(case)
    assert connections == []
    shown = f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert result.returncode == 0 and "Traceback" not in result.stderr, shown
    assert len(dropped_lines(result.stderr)) == 1, shown
    assert_nothing_half_written(case / ("sweep" if "sweep" in name else "run"))


@pytest.mark.slow
def test_a_requeued_run_resumes_its_own_dir_keeping_its_best(roads: dict):
    """No path of its own is dropped, and its best checkpoint stays the one it had (no better epoch comes)."""
    case, bests, result, _ = roads["requeued-in-its-own-dir"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert dropped_lines(result.stderr) == []
    assert bests and best_files(case / "run") == bests
    assert json.loads((case / "run" / "results.json").read_text())["epochs"] == 4


@pytest.mark.slow
def test_a_sweep_carried_on_over_results_that_are_not_a_jobs_fails_those_jobs_naming_the_files(roads: dict):
    case, _, result, _ = roads["sweep-of-unreadable-results"]
    assert result.returncode == SWEEP_FAILED and "Traceback" not in result.stderr, result.stderr[-3000:]
    for job, problem in (("0", "holds a list of 1, not a job's results"), ("1", "is not JSON")):
        line = f"job {job} error: {case / 'sweep' / job / 'results.json'} {problem}"
        assert any(text.startswith(line) for text in result.stdout.splitlines()), result.stdout[-3000:]
    assert result.stderr.rstrip().splitlines()[-1].startswith("error: 2 of 2 sweep jobs failed (job 0, 1)")


def malformed_case(name: str) -> BadInput:
    make, named = MALFORMED[name]

    def prepare(case_dir: Path, ckpt: Path) -> None:
        make(ckpt, case_dir / "malformed.ckpt")

    return BadInput(name, ("ckpt_path={dir}/malformed.ckpt", "trainer.max_epochs=4"), (named,), prepare=prepare)


MALFORMED_CASES = [malformed_case(name) for name in ("lr-a-string", "a-loop-key-missing", "a-position-key-unknown")]

test_bad_input_exits_2_with_one_error_line_naming_it = pytest.mark.slow(bad_input_test(MALFORMED_CASES))


def test_an_error_line_shows_control_characters_as_text():
    """A name read from a file reaches the terminal as text, never as one of its escape codes."""
    assert (
        error_line(UserError("ckpt_path=x: its key 'a\x1b[2J\u202eb'"))
        == "error: ckpt_path=x: its key 'a\\x1b[2J\\u202eb'"
    )


# A sharded checkpoint (trainer=fsdp's layout: DCP's shards and index, meta.pt) whose index or optimizer state is not
# of the shape DCP and torch write: one line, as the checkpoint is opened, by whatever road.


def sharded_checkpoint(directory: Path, optimizer: dict) -> Path:
    """A sharded checkpoint of a one-weight module and `optimizer` (its state by parameter name, as DCP stores it)."""
    dcp.save({"state_dict": {"w": torch.ones(2)}, "optimizer_0": optimizer}, checkpoint_id=directory, no_dist=True)
    torch.save({"pytorch-lightning_version": L.__version__, "global_step": 1}, directory / "meta.pt")
    return directory


def with_index(directory: Path, edit: Callable[[object], None]) -> Path:
    with (directory / ".metadata").open("rb") as file:
        index = pickle.load(file)  # this test's own file
    edit(index)
    (directory / ".metadata").write_bytes(pickle.dumps(index))
    return directory


def first_place(index: object) -> object:
    return next(iter(index.storage_data.values()))


SHARDED: dict[str, tuple[Callable[[object], None], str]] = {
    "places-a-list": (lambda index: setattr(index, "storage_data", []), "storage_data is not a mapping"),
    "entries-a-list": (
        lambda index: setattr(index, "state_dict_metadata", []),
        "state_dict_metadata is not a mapping of names",
    ),
    "a-place-of-no-file": (
        lambda index: setattr(first_place(index), "relative_path", None),
        "storage_data holds what is not a place in a shard of one of its entries",
    ),
    "an-offset-a-string": (
        lambda index: setattr(first_place(index), "offset", "0"),
        "storage_data holds what is not a place in a shard of one of its entries",
    ),
}
GOOD_OPTIMIZER = {"state": {}, "param_groups": [{"lr": 0.5, "params": ["w"]}]}


@pytest.mark.parametrize("case", SHARDED)
def test_a_sharded_index_of_another_shape_is_one_line_before_dcp_reads_it(case: str, tmp_path: Path):
    edit, problem = SHARDED[case]
    checkpoint = with_index(sharded_checkpoint(tmp_path / "sharded.ckpt", GOOD_OPTIMIZER), edit)
    with pytest.raises(UserError, match=re.escape(f"whose .metadata is not of the shape DCP writes ({problem})")):
        check_shards(checkpoint)


@pytest.mark.parametrize(
    "optimizer",
    [
        {"state": {}, "param_groups": [{"lr": 0.5, "params": "w"}]},
        {"state": {}, "param_groups": {"lr": 0.5}},
        {"state": {"v": {"momentum_buffer": torch.ones(2)}}, "param_groups": [{"lr": 0.5, "params": ["w"]}]},
    ],
    ids=["params-a-string", "groups-a-mapping", "state-of-no-parameter"],
)
def test_a_sharded_optimizer_state_of_another_shape_is_one_line(optimizer: dict, tmp_path: Path):
    assert plain_checkpoint(sharded_checkpoint(tmp_path / "good.ckpt", GOOD_OPTIMIZER))["optimizer_states"] == [
        {"state": {}, "param_groups": [{"lr": 0.5, "params": [0]}]}
    ]
    with pytest.raises(UserError, match=r"is a sharded checkpoint whose shards are not a module's weights and optim"):
        plain_checkpoint(sharded_checkpoint(tmp_path / "sharded.ckpt", optimizer))
