"""Every command of the README and of docs/*.md runs as written: a page's command that no longer runs fails.

A page's commands are read from its ```bash blocks when the tests are collected, so a new line is tested without
touching a test. They run as a user would type them into one shell, in page order, in one working directory per page
that holds small MNIST, Fashion-MNIST and KMNIST files under data/ (so nothing is downloaded), and the files the
page's ```python and ```yaml blocks name on their first line (`# my_data.py, ...`): `ckpt_path=last` and
`CKPT=$(ls -t ...)` find the runs of the lines above them. A page's test module gives the only departures from
the text (`DocsPage`), and fails when one of them names a line the page no longer has. A command that needs an
optional part that is not here (parts.yaml's `commands`) skips, saying so. The shell's `python` and `torchrun` are
the venv's through tests/preloaded_bin: the runs, their ranks and torchrun's workers are forked from the tests'
preloaded Python, as `run_module` runs them.
"""

import math
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.helpers import PARTS, REPO, check_ok, part_present, shell_environment
from tests.idx_files import write_idx_dataset

# The IDX files every dataset folder gets: more training images than data/mnist.yaml's val_size (5000).
TRAIN_IMAGES, TEST_IMAGES = 5200, 200
VARIABLE_ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=")
RUN_TEST = "test_the_pages_command_runs_as_written"


@dataclass(frozen=True)
class DocsPage:
    """A page and its departures from the text.

    not_run_here: a line this machine cannot run (a server, a cluster, a GPU job), and where it is tested instead.
    needs_gpu: lines marked `gpu`, which conftest skips where no CUDA GPU is visible.
    smaller: overrides appended to a line to keep the page's test within minutes on two cores.
    placeholders: text a user replaces by their own, and its replacement, relative to the working directory.
    """

    path: Path
    not_run_here: dict[str, str] = field(default_factory=dict)
    needs_gpu: frozenset[str] = frozenset()
    smaller: dict[str, str] = field(default_factory=dict)
    placeholders: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(REPO))

    @classmethod
    def run_elsewhere(cls, path: Path, where: str) -> "DocsPage":
        """A page none of whose lines can run here (a cluster's, several machines'), and where they are tested."""
        return cls(path, not_run_here=dict.fromkeys(page_commands(path.read_text()), where))


def page_commands(text: str) -> list[str]:
    """The command lines of the page's ```bash blocks, without trailing comments."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"(^|\s)#.*", "", line).strip()
            if command:
                commands.append(command)
    return commands


def page_files(text: str) -> dict[str, str]:
    """The ```python and ```yaml blocks whose first line names their file (`# my_conf/data/circle.yaml ...`)."""
    files = {}
    for body in re.findall(r"^```(?:python|yaml)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        named = re.match(r"# ([\w/.]+\.(?:py|yaml))\b", body)
        if named:
            files[named.group(1)] = body
    return files


def section_blocks(page: Path, title: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced block under the page's `## <title>`."""
    section = page.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w+)\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


def follow_steps(steps: list[tuple[str, str]], cwd: Path, extra_env: dict[str, str]) -> Path:
    """The classes and YAML files into the files their first lines name, then the commands (the last block), as a
    user would in `cwd`; the results.json of the one run they make."""
    for _, text in steps[:-1]:
        path = cwd / re.match(r"# ([\w/.]+\.\w+)", text).group(1)  # the file its first line names
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for command in steps[-1][1].strip().splitlines():
        env = shell_environment(extra_env)
        result = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    [results] = list(cwd.glob("outputs/*/*/results.json"))
    return results


def missing_parts(command: str) -> list[str]:
    """The optional parts the command needs (its words name them, parts.yaml's `commands`) that are not here."""
    return [
        name
        for name, part in PARTS.items()
        if any(word in command for word in part["commands"]) and not part_present(name)
    ]


class DocsShell:
    """One user's shell in one directory: a page's commands in page order, each run once.

    Asking for a command's result runs the earlier ones first, so a single test id can be run alone. A line that
    assigns a shell variable (`CKPT=...`) is evaluated once, there, and the later lines see its value.
    """

    def __init__(self, page: DocsPage, cwd: Path) -> None:
        self.page, self.cwd = page, cwd
        self.commands = page_commands(page.path.read_text())
        self.variables: dict[str, str] = {}
        self.results: dict[int, subprocess.CompletedProcess] = {}

    def runs_here(self, command: str) -> bool:
        gpu_missing = command in self.page.needs_gpu and not torch.cuda.is_available()
        return command not in self.page.not_run_here and not gpu_missing and not missing_parts(command)

    def result(self, index: int) -> subprocess.CompletedProcess:
        for earlier in range(index + 1):
            if earlier not in self.results and self.runs_here(self.commands[earlier]):
                self.results[earlier] = self.run(self.commands[earlier])
        return self.results[index]

    def as_run(self, command: str) -> str:
        """The line with its placeholders filled in and its smaller sizes appended."""
        written = command
        for placeholder, replacement in self.page.placeholders.items():
            command = command.replace(placeholder, str(self.cwd / replacement))
        return f"{command} {self.page.smaller[written]}" if written in self.page.smaller else command

    def run(self, command: str) -> subprocess.CompletedProcess:
        script = self.as_run(command)
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


def datasets(base: Path) -> Path:
    """Small MNIST, Fashion-MNIST and KMNIST files, written once per test process under `base`; the runs only read
    them."""
    root = base / "docs-datasets"
    if not root.is_dir():
        for folder in ("MNIST", "FashionMNIST", "KMNIST"):
            write_idx_dataset(root, folder, train_count=TRAIN_IMAGES, test_count=TEST_IMAGES)
    return root


def user_directory(page: DocsPage, cwd: Path, data: Path) -> DocsShell:
    """A user's working directory for `page`: the datasets `data` holds under data/ (and under the placeholders'
    stand-ins), and the page's own files."""
    for root in ("data", *page.placeholders.values()):
        (cwd / root).mkdir(parents=True, exist_ok=True)
        for folder in data.iterdir():
            (cwd / root / folder.name).symlink_to(folder, target_is_directory=True)
    for name, text in page_files(page.path.read_text()).items():
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text(text)
    return DocsShell(page, cwd)


def printed_run_dirs(output: str) -> list[Path]:
    return [Path(path) for path in re.findall(r"^run dir:? +(\S+)", output, flags=re.MULTILINE)]


def sweep_metrics(output: str) -> list[float]:
    """The metric column of the sweep table printed at the end of a `-m` sweep."""
    assert "\nSweep: " in output, "no sweep table printed"
    rows = output.split("\nSweep: ", 1)[1].splitlines()[1:]  # after "<N> job(s)"
    return [float(row.split()[-2]) for row in rows if row[:1].isdigit()]


def check_promised_outputs(command: str, result: subprocess.CompletedProcess, cwd: Path) -> None:
    """What the docs say the command leaves behind, beyond its exit status (the entry points' own promises)."""
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
    elif {"project.train", "project/train.py"} & set(words):
        (run_dir,) = printed_run_dirs(output)
        assert "\nResults\n" in output and (run_dir / "results.json").is_file()
        if any(word.startswith("ckpt_path=") for word in words):
            assert "Restored all states from the checkpoint" in result.stderr
        if "debug=profile" in words:
            assert (run_dir / "fit-profile.txt").is_file()


def docs_page_tests(page: DocsPage, check: Callable | None = None) -> tuple[Callable, Callable, Callable]:
    """The fixture and the two tests of a page's commands, for its test module to name: (its shell, that the page has
    the lines its departures name, that each line runs as written). `check(command, result, cwd)` adds the page's
    own promises."""
    commands = page_commands(page.path.read_text())

    @pytest.fixture(scope="module")
    def docs_shell(tmp_path_factory: pytest.TempPathFactory) -> DocsShell:
        data = datasets(tmp_path_factory.getbasetemp())
        return user_directory(page, tmp_path_factory.mktemp("docs-user"), data)

    def test_the_page_names_the_lines_its_tests_depart_from() -> None:
        """Every departure names a line of the page: a stale one would silently test nothing."""
        assert commands, f"no ```bash commands in {page.name}"
        for command in [*page.not_run_here, *page.needs_gpu, *page.smaller]:
            assert command in commands, f"{command!r} is no longer a command of {page.name}: update its test"
        for placeholder in page.placeholders:
            assert any(placeholder in command for command in commands), f"no command of {page.name} uses it"

    def param(index: int, command: str):
        marks = [pytest.mark.gpu] if command in page.needs_gpu else []
        if command in page.not_run_here:
            marks.append(pytest.mark.skip(reason=page.not_run_here[command]))
        elif missing_parts(command):
            reason = f"needs the optional part(s) {', '.join(missing_parts(command))}, removed here"
            marks.append(pytest.mark.skip(reason=reason))
        return pytest.param(index, marks=marks, id=f"{index + 1:02d} {command}")

    @pytest.mark.slow
    @pytest.mark.parametrize("index", [param(index, command) for index, command in enumerate(commands)])
    def test(docs_shell: DocsShell, index: int) -> None:
        """Exit status 0 and the outputs the page promises (results table, sweep table, files), in page order."""
        command = commands[index]
        result = check_ok(docs_shell.result(index))
        check_promised_outputs(command, result, docs_shell.cwd)
        if check is not None:
            check(command, result, docs_shell.cwd)

    test.__name__ = RUN_TEST
    return docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test
