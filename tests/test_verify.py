"""`python -m project.verify <run dir>`: a run re-run from its directory reproduces its per-step losses and final
metrics bitwise on a CPU, alone and under DDP; a one-line change to the network's initialisation is caught, named by
file and first differing step; a dir it cannot verify ends in one `error:` line and is left as it was."""

import json
import os
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from project import verify
from project.engine.run_dir import RECEIPT_FILE, process_start_time
from tests.helpers import REPO, check_ok, run_module, scratch_repository

# The one line changed in the scratch repository: the first layer initialised otherwise.
FIRST_LAYER = "            nn.Linear(num_inputs, 30),\n"
# The torch a run's receipt is edited to name, as if it had been made before an upgrade.
OLDER_TORCH = "2.13.0"
FIRST_LAYER_CHANGED = "            nn.Linear(num_inputs, 30).apply(lambda layer: nn.init.normal_(layer.weight)),\n"


def train(cwd: Path, run_dir: Path, *overrides: str) -> Path:
    """One epoch (2 steps) of the toy in `run_dir`."""
    args = ("logger=none", "trainer.max_epochs=1", *overrides, f"hydra.run.dir={run_dir}")
    check_ok(run_module("project.train", *args, cwd=cwd, env={"PYTHONPATH": str(cwd)}))
    return run_dir


def set_distribution_version(run_dir: Path, name: str, version_then: str) -> None:
    """As if the run had been made with `version_then` of the distribution `name` installed."""
    path = run_dir / RECEIPT_FILE
    receipt = json.loads(path.read_text())
    assert name in receipt["segments"][-1]["environment"]["distributions"]
    receipt["segments"][-1]["environment"]["distributions"][name] = version_then
    path.write_text(json.dumps(receipt))


def verified(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_module("project.verify", *args, cwd=cwd, env={"PYTHONPATH": str(cwd)})


def reproduced_lines(run_dir: Path) -> list[str]:
    """What `project.verify <run_dir>` printed, run from the repository, where it reproduced the run (exit 0)."""
    return check_ok(verified(REPO, str(run_dir))).stdout.strip().splitlines()


@pytest.fixture(scope="module")
def changed_network(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A toy run in a scratch repository, verified as it is and after a one-line change to its network's
    initialisation (the first step only: `--steps 1`), with its receipt saying it ran under another torch."""
    repository = scratch_repository(tmp_path_factory.mktemp("repository"))
    run_dir = train(repository, repository / "outputs" / "run")
    same = verified(repository, str(run_dir))
    networks = repository / "project" / "example" / "networks.py"
    source = networks.read_text()
    assert source.count(FIRST_LAYER) == 1
    networks.write_text(source.replace(FIRST_LAYER, FIRST_LAYER_CHANGED))
    set_distribution_version(run_dir, "torch", OLDER_TORCH)
    changed = verified(repository, str(run_dir), "--steps", "1")
    return {"run_dir": run_dir, "same": same, "changed": changed}


@pytest.mark.slow
def test_a_single_run_is_reproduced_bitwise_its_losses_and_final_metrics(changed_network):
    result = check_ok(changed_network["same"])
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "reproduced bitwise: 2 step(s) on each of 1 process(es)"
    assert "  the 8 final metrics equal" in lines
    assert not [line for line in lines if line.startswith("  changed since")]


@pytest.mark.slow
def test_a_one_line_change_to_the_networks_initialisation_is_named_with_the_first_differing_step(changed_network):
    result = changed_network["changed"]
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("differs from step 1 (rank 0: loss ")
    assert lines[-1].endswith(
        "1 step(s) on each of 1 process(es) (the first 1 steps only: --steps 1; final metrics not compared)"
    )
    (changed,) = [line for line in lines if line.startswith("  changed since: ")]
    assert changed.startswith("  changed since: project/example/networks.py (sha256 ")


@pytest.mark.slow
def test_a_version_that_moved_since_the_run_is_named_from_then_to_now(changed_network):
    lines = changed_network["changed"].stdout.splitlines()
    assert f"  version moved: torch {OLDER_TORCH} → {version('torch')}" in lines


@pytest.mark.slow
def test_a_ddp_run_without_a_receipt_is_reproduced_bitwise_on_every_rank_and_says_the_receipt_is_missing(
    tmp_path: Path,
):
    run_dir = train(REPO, tmp_path / "run", "trainer=ddp", "trainer.devices=2")
    (run_dir / RECEIPT_FILE).unlink()
    lines = reproduced_lines(run_dir)
    assert lines[-1] == "reproduced bitwise: 1 step(s) on each of 2 process(es)"
    assert "  receipt missing (a run from before receipts): compared by its config and history alone" in lines
    reruns = list((run_dir / "verify").iterdir())
    assert len(reruns) == 1 and sorted(p.name for p in reruns[0].glob("history.rank*.json")) == [
        "history.rank0.json",
        "history.rank1.json",
    ]


@pytest.mark.slow
def test_an_fsdp_run_is_reproduced_bitwise_on_both_ranks(tmp_path: Path):
    run_dir = train(REPO, tmp_path / "run", "trainer=fsdp", "trainer.devices=2")
    lines = reproduced_lines(run_dir)
    assert lines[-1] == "reproduced bitwise: 1 step(s) on each of 2 process(es)"
    assert "  the 8 final metrics equal" in lines


@pytest.mark.slow
def test_a_run_resumed_in_its_own_dir_is_reproduced_bitwise_over_every_step_of_both_starts(tmp_path: Path):
    """Trained one epoch, resumed from its last checkpoint to two: the re-run trains both epochs straight through, and
    all 4 steps are compared, those before the resume too."""
    run_dir = train(REPO, tmp_path / "run")
    train(REPO, run_dir, "trainer.max_epochs=2", "ckpt_path=last")
    assert len(json.loads((run_dir / "history.rank0.json").read_text())["step_losses"]) == 4
    lines = reproduced_lines(run_dir)
    assert lines[-1] == "reproduced bitwise: 4 step(s) on each of 1 process(es)"
    assert "  the run was started 2 times (resumed): the re-run trains it whole, from step 0" in lines


@pytest.mark.slow
def test_one_job_of_a_sweep_is_reproduced_bitwise_by_itself(tmp_path: Path):
    """The second job (seed=2) of a two-job sweep, re-run alone: its own overrides, not the sweep's."""
    sweep = tmp_path / "sweep"
    args = ("-m", "logger=none", "trainer.max_epochs=1", "seed=1,2", f"hydra.sweep.dir={sweep}")
    check_ok(run_module("project.train", *args, cwd=REPO, env={"PYTHONPATH": str(REPO)}))
    lines = reproduced_lines(sweep / "1")
    assert lines[-1] == "reproduced bitwise: 2 step(s) on each of 1 process(es)"
    (rerun,) = (sweep / "1" / "verify").iterdir()
    assert yaml.safe_load((rerun / ".hydra" / "config.yaml").read_text())["seed"] == 2
    assert (rerun / "history.rank0.json").is_file(), "the re-run is one run, not a sweep of jobs"


def test_a_history_that_starts_after_step_0_is_compared_from_there_and_the_verdict_says_so():
    """A run resumed from another run's checkpoint holds only its own steps: the verdict names the first one."""
    resumed = SimpleNamespace(histories=[{"first_step": 6, "step_losses": [0.5, 0.25]}])
    assert verify.unrecorded_start(resumed).startswith(", from step 7 on (its history starts where it resumed: ")
    assert verify.unrecorded_start(SimpleNamespace(histories=[{"first_step": 0, "step_losses": [0.5]}])) == ""


def truncated(run_dir: Path) -> None:
    path = run_dir / RECEIPT_FILE
    path.write_text(path.read_text()[:100])


def foreign(run_dir: Path) -> None:
    (run_dir / RECEIPT_FILE).write_text(json.dumps({"format": "another tool's", "segments": [{}]}))


def still_running(run_dir: Path) -> None:
    """As the run looks while this very process trains it: its receipt names this process, no results yet."""
    receipt = json.loads((run_dir / RECEIPT_FILE).read_text())
    receipt["segments"][-1]["launch"] |= {"pid": os.getpid(), "process_start": process_start_time(os.getpid())}
    (run_dir / RECEIPT_FILE).write_text(json.dumps(receipt))
    (run_dir / "results.json").unlink()


def set_in_config(run_dir: Path, key: str, value: object) -> None:
    path = run_dir / ".hydra" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    group, name = key.split(".")
    config[group][name] = value
    path.write_text(yaml.safe_dump(config))


def set_launcher(run_dir: Path, launcher: dict[str, str]) -> None:
    """As if a launcher had started the run: its receipt's launcher ids."""
    receipt = json.loads((run_dir / RECEIPT_FILE).read_text())
    receipt["segments"][-1]["launch"]["launcher"] = launcher
    (run_dir / RECEIPT_FILE).write_text(json.dumps(receipt))


def not_a_run(run_dir: Path) -> None:
    shutil.rmtree(run_dir / ".hydra")


ERROR_CASES = {
    "truncated": (truncated, "cannot be read as a receipt"),
    "foreign": (foreign, "is no receipt of this project (its format is not 'project receipt 1')"),
    "not-a-run": (not_a_run, "is not a run's directory (no .hydra/config.yaml and hydra.yaml)"),
    "running": (still_running, "is still running (process "),
    "two-nodes": (
        lambda d: set_in_config(d, "trainer.num_nodes", 2),
        "ran on 2 node(s) with 1 process(es) each, and project.verify re-runs it with srun: verify it in an "
        "allocation of 2 node(s) with 1 task(s) each: salloc --nodes=2 --ntasks-per-node=1 python -m project.verify ",
    ),
    "srun": (
        lambda d: set_launcher(d, {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}),
        "ran on 1 node(s) with 1 process(es) each (Slurm job 42), and ",
    ),
    "torchrun": (
        lambda d: set_launcher(d, {"TORCHELASTIC_RUN_ID": "7"}),
        "ran under torchrun (1 processes on 1 node(s)), and project.verify starts no torchrun",
    ),
    "hostile": (lambda d: set_in_config(d, "model._target_", "os.system"), "names the target 'os.system'"),
    "searchpath": (
        lambda d: add_override(d, "hydra", f"hydra.searchpath=[file://{d.parent}]"),
        "which project.verify reads only where you give them",
    ),
    "download": (lambda d: add_override(d, "task", "+data.download=true"), "would fetch data as the re-run starts"),
    "first-step": (lambda d: set_first_step(d, "x"), "holds no step its losses start at (first_step: 'x')"),
}


def set_first_step(run_dir: Path, value: object) -> None:
    path = run_dir / "history.rank0.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"first_step": value}))


def add_override(run_dir: Path, kind: str, override: str) -> None:
    """An override the run dir says it ran with (hydra.yaml's lists): a task override, or a Hydra one."""
    path = run_dir / ".hydra" / "hydra.yaml"
    hydra = yaml.safe_load(path.read_text())
    hydra["hydra"]["overrides"][kind].append(override)
    path.write_text(yaml.safe_dump(hydra))


@pytest.mark.slow
@pytest.mark.parametrize("case", ERROR_CASES.values(), ids=ERROR_CASES.keys())
def test_a_dir_that_cannot_be_verified_ends_in_one_error_line_and_is_left_as_it_was(
    case, changed_network, tmp_path: Path, capsys
):
    spoil, expected = case
    run_dir = shutil.copytree(changed_network["run_dir"], tmp_path / "run", ignore=shutil.ignore_patterns("verify"))
    spoil(run_dir)
    before = sorted((path, path.stat().st_mtime_ns) for path in run_dir.rglob("*"))
    with pytest.raises(SystemExit) as stop:
        verify.main([str(run_dir)])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("error: ") and expected in line
    assert sorted((path, path.stat().st_mtime_ns) for path in run_dir.rglob("*")) == before


@pytest.mark.parametrize(
    ("variable", "tasks"),
    [("2(x3),1", [2, 2, 2, 1]), ("1(x2)", [1, 1]), ("4", [4]), ("two", [])],
)
def test_an_allocations_tasks_per_node_are_read_from_slurms_variable(monkeypatch, variable: str, tasks: list[int]):
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", variable)
    assert verify.allocation_tasks_per_node() == tasks
    monkeypatch.delenv("SLURM_JOB_ID")
    assert verify.allocation_tasks_per_node() is None


@pytest.mark.slow
def test_a_two_node_run_in_an_allocation_of_another_shape_is_refused_naming_the_shape_it_needs(
    changed_network, tmp_path: Path, monkeypatch, capsys
):
    """Inside an allocation (as in salloc's shell) of 1 node with 2 tasks, a run of 2 nodes with 1 process each."""
    run_dir = shutil.copytree(changed_network["run_dir"], tmp_path / "run", ignore=shutil.ignore_patterns("verify"))
    set_in_config(run_dir, "trainer.num_nodes", 2)
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2")
    with pytest.raises(SystemExit) as stop:
        verify.main([str(run_dir)])
    assert stop.value.code == 2 and not (run_dir / "verify").exists()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        "ran on 2 node(s) with 1 process(es) each, and this allocation (Slurm job 43) has tasks per node [2]: verify "
        f"it in an allocation of 2 node(s) with 1 task(s) each: salloc --nodes=2 --ntasks-per-node=1 python -m "
        f"project.verify {run_dir}"
    )
