"""Every command of the README's one-machine sections runs as written (a README command that no longer runs fails).

The commands are read from README.md's ```bash blocks when the tests are collected, so a new README line is
tested without touching this file. They run as a user would type them into one shell, in README order, in one
working directory that holds small MNIST, Fashion-MNIST and KMNIST files under data/ (so nothing is downloaded):
`ckpt_path=last` and `CKPT=$(ls -t outputs/20*/*/checkpoints/last.ckpt | head -1)` find the runs of the lines
above them. The tables
below are the only departures from the README text, and a test fails when one of their lines leaves the README.
The shell's `python` and `torchrun` are the venv's through tests/preloaded_bin: the runs, their ranks and torchrun's
workers are forked from the tests' preloaded Python, as `run_module` runs them.
"""

import math
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, check_ok, shell_environment
from tests.idx_files import write_idx_dataset

pytestmark = pytest.mark.slow

SECTIONS = ("Switches that work today", "Inspecting, resuming, evaluating, searching")

# README lines this machine cannot run, and where they are tested instead.
NOT_RUN_HERE = {
    "make tensorboard": "a server that runs until stopped: "
    "tests/test_workflow.py::test_tensorboard_server_serves_scalars_and_hparams_of_a_run starts and queries it",
    "python -m project.train trainer=slurm trainer.num_nodes=2 trainer.devices=1": "runs under srun in a Slurm "
    "allocation: tests/test_slurm.py on the local cluster, tests/test_strategies.py on simulated nodes",
    "mlflow server --backend-store-uri sqlite:///outputs/mlflow.db --host 127.0.0.1 --port 5000": "a server that "
    "runs until stopped: tests/test_mlflow.py starts one on a free port and logs runs, a DDP run and a sweep to it",
    "python -m project.train logger=mlflow logger.mlflow.tracking_uri=http://127.0.0.1:5000": "needs the server of "
    "the line above: tests/test_mlflow.py runs it (with trainer=ddp, as a sweep, as logger=many) on its own server",
}
# README lines that need a CUDA GPU: marked `gpu`, so conftest skips them where none is visible.
NEEDS_GPU = {"python -m project.train trainer=gpu"}
# Text a user replaces by their own: the replacement, relative to the working directory.
PLACEHOLDERS = {"/path/to/datasets": "datasets"}
# Overrides appended to a README line to keep this module within minutes on two cores.
SMALLER = {
    "python -m project.train experiment=mnist hparams_search=mnist_optuna": "hydra.sweeper.n_trials=2",
    "python -m project.train experiment=mnist hparams_search=mnist_optuna 'hydra.sweeper.pruner={_target_:optuna."
    "pruners.MedianPruner,n_startup_trials:5,n_warmup_steps:1}'": "hydra.sweeper.n_trials=2 trainer.max_epochs=1",
}
# The IDX files every dataset folder gets: more training images than data/mnist.yaml's val_size (5000).
TRAIN_IMAGES, TEST_IMAGES = 5200, 200
VARIABLE_ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=")


def readme_commands(readme: str, sections: tuple[str, ...] = SECTIONS) -> list[str]:
    """The command lines of the ```bash blocks under the `## <section>` headings, without trailing comments."""
    commands = []
    for section in re.split(r"^## ", readme, flags=re.MULTILINE)[1:]:
        if section.splitlines()[0].strip() not in sections:
            continue
        for block in re.findall(r"^```bash\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"(^|\s)#.*", "", line).strip()
                if command:
                    commands.append(command)
    return commands


COMMANDS = readme_commands((REPO / "README.md").read_text())


def runs_here(command: str) -> bool:
    return command not in NOT_RUN_HERE and (command not in NEEDS_GPU or torch.cuda.is_available())


def as_run(command: str, cwd: Path) -> str:
    """The README line with its placeholders filled in and its smaller sizes appended."""
    for placeholder, replacement in PLACEHOLDERS.items():
        command = command.replace(placeholder, str(cwd / replacement))
    return f"{command} {SMALLER[command]}" if command in SMALLER else command


class ReadmeShell:
    """One user's shell in one directory: the README's commands in README order, each run once.

    Asking for a command's result runs the earlier commands first, so a single test id can be run alone. A line
    that assigns a shell variable (`CKPT=...`) is evaluated once, there, and the later lines see its value.
    """

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.variables: dict[str, str] = {}
        self.results: dict[int, subprocess.CompletedProcess] = {}

    def result(self, index: int) -> subprocess.CompletedProcess:
        for earlier in range(index + 1):
            if earlier not in self.results and runs_here(COMMANDS[earlier]):
                self.results[earlier] = self.run(COMMANDS[earlier])
        return self.results[index]

    def run(self, command: str) -> subprocess.CompletedProcess:
        script = as_run(command, self.cwd)
        assignment = VARIABLE_ASSIGNMENT.match(command)
        if assignment:
            script += f'\nprintf %s "${assignment[1]}"'
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=shell_environment(self.variables),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if assignment:
            self.variables[assignment[1]] = result.stdout
        return result


@pytest.fixture(scope="module")
def readme_shell(tmp_path_factory: pytest.TempPathFactory) -> ReadmeShell:
    """A user's working directory with the three datasets under data/ and under the placeholders' stand-ins."""
    cwd = tmp_path_factory.mktemp("readme-user")
    for root in ("data", *PLACEHOLDERS.values()):
        for folder in ("MNIST", "FashionMNIST", "KMNIST"):
            write_idx_dataset(cwd / root, folder, train_count=TRAIN_IMAGES, test_count=TEST_IMAGES)
    return ReadmeShell(cwd)


def command_param(index: int, command: str):
    marks = [pytest.mark.gpu] if command in NEEDS_GPU else []
    if command in NOT_RUN_HERE:
        marks.append(pytest.mark.skip(reason=NOT_RUN_HERE[command]))
    return pytest.param(index, marks=marks, id=f"{index + 1:02d} {command}")


def printed_run_dirs(output: str) -> list[Path]:
    return [Path(path) for path in re.findall(r"^run dir:? +(\S+)", output, flags=re.MULTILINE)]


def sweep_metrics(output: str) -> list[float]:
    """The metric column of the sweep table printed at the end of a `-m` sweep."""
    assert "\nSweep: " in output, "no sweep table printed"
    rows = output.split("\nSweep: ", 1)[1].splitlines()[1:]  # after "<N> job(s)"
    return [float(row.split()[-2]) for row in rows if row[:1].isdigit()]


def check_promised_outputs(command: str, result: subprocess.CompletedProcess, cwd: Path) -> None:
    """What the README says the command leaves behind, beyond its exit status."""
    output = result.stdout
    words = shlex.split(command)
    overrides = words[next((i + 1 for i, word in enumerate(words) if word.startswith("project.")), len(words)) :]
    if VARIABLE_ASSIGNMENT.match(command):
        assert (cwd / output).exists(), f"{command!r} set {output!r}, which names nothing"
    elif "-m" in overrides or any(word.startswith("hparams_search=") for word in overrides):
        metrics = sweep_metrics(output)
        assert len(metrics) >= 2 and all(math.isfinite(value) for value in metrics), metrics
        assert len(printed_run_dirs(output)) == len(metrics)  # each job's own results table
    elif "project.evaluate" in words:
        (accuracy,) = re.findall(r"^test/acc\s+(\S+)$", output, flags=re.MULTILINE)
        assert 0 <= float(accuracy) <= 1
    elif "project.predict" in words:
        (run_dir,) = printed_run_dirs(output)
        rows = (run_dir / "predictions.csv").read_text().splitlines()
        assert rows[0] == "index,label,predicted,confidence" and len(rows) > 1
        assert (run_dir / "confusion_matrix.png").is_file()
    elif "project.optional.image_folder.example" in words:
        root = cwd / words[-1]
        assert output.startswith("wrote ") and {path.name for path in root.iterdir()} == {"train", "val", "test"}
    elif "project.optional.reference.compare" in words:
        (run_dir,) = printed_run_dirs(output)
        assert (run_dir / "loss_curves.png").is_file() and (run_dir / "comparison.json").is_file()
    else:
        (run_dir,) = printed_run_dirs(output)
        assert "\nResults\n" in output and (run_dir / "results.json").is_file()
        if any(word.startswith("ckpt_path=") for word in words):
            assert "Restored all states from the checkpoint" in result.stderr
        if "debug=profile" in words:
            assert (run_dir / "fit-profile.txt").is_file()


def test_readme_sections_list_the_commands_this_module_knows():
    """The sections exist and every table entry names a README line: a stale entry would silently test nothing."""
    readme = (REPO / "README.md").read_text()
    for section in SECTIONS:
        assert readme_commands(readme, (section,)), f"no ```bash commands under '## {section}'"
    for command in [*NOT_RUN_HERE, *NEEDS_GPU, *SMALLER]:
        assert command in COMMANDS, f"{command!r} is no longer a README command: update the table"
    for placeholder in PLACEHOLDERS:
        assert any(placeholder in command for command in COMMANDS), f"no README command uses {placeholder}"


@pytest.mark.parametrize("index", [command_param(index, command) for index, command in enumerate(COMMANDS)])
def test_readme_command_runs_as_written(readme_shell: ReadmeShell, index: int):
    """Exit status 0 and the outputs the README promises (results table, sweep table, files), in README order."""
    command = COMMANDS[index]
    result = check_ok(readme_shell.result(index))
    check_promised_outputs(command, result, readme_shell.cwd)
