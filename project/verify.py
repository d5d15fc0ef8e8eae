"""Re-run a run from its directory and check it: `python -m project.verify <run dir> [--steps N] [--searchpath DIR]`.

The run is trained again from its stored overrides, under the same strategy and number of processes (a Slurm or
multi-node run: with srun, inside a Slurm allocation of its shape), in `<run dir>/verify/<time>/`; every rank's
per-step losses (`history.rank<N>.json`) and the final metrics (`results.json`) are compared with the original's, and
the two receipts (`receipt.json`) say what differs: files changed since, versions that moved, another machine or
world size. The last line is the verdict: reproduced bitwise, reproduced within tolerance, or differs from step K.
Exit 0 when reproduced, 1 when not, 2 when it cannot verify (one `error:` line). docs/reproducibility.md.

A run dir is data, as a checkpoint is (docs/checkpoints.md, "A checkpoint is data"): every `_target_` its config or
overrides name must be named by a config file of conf/ or of a `--searchpath` directory the user gives (the run's own
`hydra.searchpath` is only checked to be among them: a run dir cannot choose which config files are trusted), or by
conf/trusted_targets.yaml; an override that switches a download on is refused (nothing connects out unless the user
says so); nothing it names as a path is followed out of it; nothing is written into it but its `verify/` folder.
"""

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import lightning as L
import yaml

from project.engine.errors import UserError, error_line
from project.engine.reports import logged_metrics
from project.engine.run_dir import (
    RECEIPT_FILE,
    ReceiptUnreadable,
    plain_path_inside,
    process_start_time,
    read_receipt,
    shown,
)
from project.engine.run_log import printable
from project.engine.sweeps import PRUNED_FILE
from project.engine.trusted_targets import DOTTED_NAME, TrustedTargets, targets_in

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
# A loss within this relative difference of the original's counts as reproduced within tolerance (a GPU's kernels
# may sum in another order); anything further differs.
RELATIVE_TOLERANCE = 1e-6
# Overrides of the original that the re-run replaces: its directory, its resume, its loggers (a verification is no
# new run in a tracker).
REPLACED_OVERRIDES = ("ckpt_path", "logger")
# A search's job is re-run with the search's settings (`results_from`, its callbacks) as one run, which no search's
# sampler or pruner reaches (project.engine.config.check_a_search_is_a_sweep).
ONE_JOB_OF_A_SEARCH = "hydra.mode=RUN"
# At most this many moved versions are named; the rest are counted.
VERSIONS_SHOWN = 8


class StopAfterSteps(L.Callback):
    """Ends training after `steps` optimizer steps: `--steps N` replays the start of a long run (a smaller
    `trainer.max_steps` would resize its learning-rate schedule, and so change the very steps compared)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


class VerifyArguments(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}: usage: python -m project.verify <run dir> [--steps N] [--searchpath DIR]")


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = VerifyArguments(prog="python -m project.verify", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run's directory, as its results table names it")
    parser.add_argument("--steps", type=int, default=None, help="replay only the first N optimizer steps")
    parser.add_argument(
        "--searchpath",
        type=Path,
        action="append",
        default=[],
        help="a directory of your own config files the run was composed with (its hydra.searchpath), which you trust",
    )
    arguments = parser.parse_args(argv)
    if arguments.steps is not None and arguments.steps < 1:
        raise UserError(f"--steps must be a positive number of optimizer steps, got {arguments.steps}")
    return arguments


def read_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise UserError(f"{path} cannot be read as {what} ({' '.join(str(error).split())})") from None


class RecordedRun:
    """What a run's directory records: its config and overrides, receipt (None: a run from before receipts),
    histories and results; read as data, checked before anything runs."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        stored = run_dir / ".hydra"
        if not (stored / "config.yaml").is_file() or not (stored / "hydra.yaml").is_file():
            raise UserError(
                f"{run_dir} is not a run's directory (no .hydra/config.yaml and hydra.yaml): give the directory a "
                "run's results table names (run dir ...)"
            )
        self.config = read_yaml(stored / "config.yaml", "a run's config")
        hydra = read_yaml(stored / "hydra.yaml", "a run's Hydra config")
        overrides = hydra.get("hydra", {}).get("overrides", {}) if isinstance(hydra, dict) else {}
        self.task_overrides = overrides.get("task") or []
        self.hydra_overrides = overrides.get("hydra") or []
        every = [*self.task_overrides, *self.hydra_overrides]
        if not isinstance(self.config, dict) or not all(isinstance(override, str) for override in every):
            raise UserError(f"{stored}: its config or overrides are not those of a run project.train wrote")
        receipt_path = run_dir / RECEIPT_FILE
        try:
            self.receipt = read_receipt(receipt_path)["segments"] if receipt_path.exists() else None
        except ReceiptUnreadable as error:
            raise UserError(f"{error}: move it aside to verify the run from its config and history alone") from None
        self.histories = histories(run_dir)
        self.results = read_json_dict(run_dir / "results.json")

    def segment(self, key: str) -> dict:
        """The last start's `key` part of the receipt (empty without a receipt)."""
        return (self.receipt[-1].get(key) or {}) if self.receipt else {}

    def check_finished(self) -> None:
        """Refuse a run still running on this machine, and one that finished no training."""
        launch = self.segment("launch")
        pid = launch.get("pid")
        if (
            self.results is None
            and isinstance(pid, int)
            and (self.segment("machine").get("host") or socket.gethostname()) == socket.gethostname()
        ):
            try:
                alive = abs(process_start_time(pid) - float(launch.get("process_start", -1))) < 1.0
            except (OSError, ValueError, IndexError):
                alive = False
            if alive:
                raise UserError(f"{self.dir} is still running (process {pid}): verify it once it has finished")
        if not self.histories:
            raise UserError(
                f"{self.dir} holds no history.rank<N>.json: its training did not finish (or callbacks=none kept "
                "none), so there are no per-step losses to compare; verify a run that finished"
            )

    def launcher_here(self) -> list[str]:
        """The command that starts the re-run's processes, before `python -m project.train`: none for a run of one
        machine (project.train starts its own processes), `srun` for a run Slurm started or of several nodes, inside a
        Slurm allocation of the run's shape; a run torchrun started is refused, saying what it needs."""
        launcher = self.segment("launch").get("launcher") or {}
        trainer = self.config.get("trainer") or {}
        nodes, devices = trainer.get("num_nodes", 1), trainer.get("devices", 1)
        if "TORCHELASTIC_RUN_ID" in launcher:
            raise UserError(
                f"{self.dir} ran under torchrun ({self.segment('launch').get('world_size', '?')} processes on "
                f"{nodes} node(s)), and project.verify starts no torchrun: re-run its overrides "
                f"({' '.join(self.task_overrides)}) under torchrun with the same shape, and compare"
            )
        if "SLURM_STEP_ID" not in launcher and not (isinstance(nodes, int) and nodes > 1):
            return []
        return srun_in_allocation(self, nodes, devices, launcher.get("SLURM_JOB_ID"))


def allocation_tasks_per_node() -> list[int] | None:
    """The tasks on each node of the Slurm allocation this process runs in (salloc's shell, an sbatch script), from
    `SLURM_TASKS_PER_NODE` (`2(x3),1`: 2 on each of 3 nodes, then 1); None outside one."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    tasks: list[int] = []
    for part in os.environ.get("SLURM_TASKS_PER_NODE", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if match is None:
            return []
        tasks += [int(match.group(1))] * int(match.group(2) or 1)
    return tasks


def srun_in_allocation(run: RecordedRun, nodes: object, devices: object, job: str | None) -> list[str]:
    """`srun` with the run's shape, as scripts/slurm/train.sbatch starts training (one task per process, each with
    the allocation's cores and as many threads), where this process runs in a Slurm allocation of `nodes` nodes with
    `devices` tasks on each; else one line saying the allocation it needs (a re-run of another shape would train
    another run)."""
    ran = f"{run.dir} ran on {printable(str(nodes))} node(s) with {printable(str(devices))} process(es) each"
    ran += f" (Slurm job {printable(str(job))})" if job else ""
    if not (isinstance(nodes, int) and isinstance(devices, int) and nodes > 0 and devices > 0):
        raise UserError(f"{ran}: its trainer.num_nodes and trainer.devices are not numbers of a shape to re-run")
    needs = (
        f"verify it in an allocation of {nodes} node(s) with {devices} task(s) each: salloc --nodes={nodes} "
        f"--ntasks-per-node={devices} python -m project.verify {shown(run.dir)}"
    )
    tasks = allocation_tasks_per_node()
    if tasks is None:
        raise UserError(f"{ran}, and project.verify re-runs it with srun: {needs}")
    if tasks != [devices] * nodes:
        this = f"Slurm job {printable(os.environ['SLURM_JOB_ID'])}"
        raise UserError(f"{ran}, and this allocation ({this}) has tasks per node {tasks}: {needs}")
    cores = os.environ.get("SLURM_CPUS_PER_TASK", "1")
    threads = os.environ.get("OMP_NUM_THREADS", cores)
    # --job-name: salloc names its allocation "interactive", a name Lightning's SLURMEnvironment takes for processes
    # started by hand, not by srun; the step's own name is what its tasks read.
    return [
        "srun",
        "--job-name=verify",
        f"--nodes={nodes}",
        f"--ntasks-per-node={devices}",
        f"--cpus-per-task={cores}",
        f"--export=ALL,OMP_NUM_THREADS={threads}",
    ]


def read_json_dict(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path} cannot be read ({error}): it is not a file a run wrote whole") from None
    if not isinstance(content, dict):
        raise UserError(f"{path} is not a file a run wrote (not a mapping)")
    return content


def histories(run_dir: Path) -> list[dict]:
    """Each rank's history in `run_dir`, in rank order, checked to hold a list of numbers and the step they start at
    (`first_step`: 0 where a history names none)."""
    found = []
    for rank in range(len(list(run_dir.glob("history.rank*.json")))):
        path = run_dir / f"history.rank{rank}.json"
        history = read_json_dict(path)
        losses = None if history is None else history.get("step_losses")
        if not isinstance(losses, list) or not all(isinstance(loss, (int, float)) for loss in losses):
            raise UserError(f"{path} holds no list of per-step losses")
        first = history.setdefault("first_step", 0)
        if type(first) is not int or first < 0:
            raise UserError(f"{path} holds no step its losses start at (first_step: {printable(repr(first))})")
        found.append(history)
    return found


def config_files_targets(searchpaths: list[Path]) -> frozenset[str]:
    """Every `_target_` the YAML files of conf/ and of the `searchpaths` name as plain text."""
    named: set[str] = set()
    for folder in [CONF_DIR, *searchpaths]:
        for file in sorted(folder.rglob("*.yaml")):
            try:
                named.update(
                    target for target in targets_in(yaml.safe_load(file.read_text())) if isinstance(target, str)
                )
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
    return frozenset(named)


def searchpaths_of(run: RecordedRun, given: list[Path]) -> tuple[list[str], list[Path]]:
    """The run's `hydra.searchpath` override (its own modules' config dirs), and the dirs it names: each one of the
    `given` directories (`--searchpath`), which the user trusts; the run dir names them but cannot choose them (a
    folder handed around beside it could name any target)."""
    overrides = [o for o in run.hydra_overrides if o.startswith("hydra.searchpath=")]
    trusted = {folder.resolve() for folder in given}
    folders = []
    for override in overrides:
        for entry in re.findall(r"[\w+]+://[^,\]\s'\"]+", override):
            scheme, _, path = entry.partition("://")
            folder = Path(path)
            if scheme != "file" or not folder.is_dir() or plain_path_inside(str(folder), run.dir):
                raise UserError(
                    f"{run.dir}: its hydra.searchpath names {printable(entry)}, which is no config directory of this "
                    "machine outside the run: project.verify takes config files only from conf/ and your own "
                    "directories (--searchpath)"
                )
            if folder.resolve() not in trusted:
                raise UserError(
                    f"{run.dir}: its config was composed with the config files of {printable(path)} "
                    f"(hydra.searchpath), which project.verify reads only where you give them: if they are yours, "
                    f"python -m project.verify {run.dir} --searchpath {printable(path)}"
                )
            folders.append(folder)
    return overrides, folders


def refuse_a_download(run: RecordedRun) -> None:
    """Refuse overrides that switch a download on: the re-run would connect out because the run dir says so (the
    rule for a checkpoint's stored config: docs/checkpoints.md); the user gives the data where it is."""
    for override in run.task_overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key.split(".")[-1] == "download" and value.strip().lower() in ("true", "1", "yes"):
            raise UserError(
                f"{run.dir}: its override {printable(override)} would fetch data as the re-run starts: project.verify "
                "connects nowhere; put the data where the run reads it (its data.root), or re-run it yourself"
            )


def check_trusted(run: RecordedRun, searchpaths: list[Path]) -> None:
    """Refuse, in one line, a run whose config or overrides name a target no config file here names (a run dir
    handed around is data: docs/checkpoints.md), or whose overrides hold an interpolation (a resolver acts)."""
    base = read_yaml(CONF_DIR / "trusted_targets.yaml", "conf/trusted_targets.yaml") or {}
    patterns = TrustedTargets.of({"trusted_targets": base.get("trusted_targets", base)}).patterns
    trust = TrustedTargets(config_files_targets(searchpaths), patterns)
    for override in run.task_overrides:
        if "${" in override:
            raise UserError(
                f"{run.dir}: its override {override} holds an interpolation, which could act as it resolves: "
                "project.verify re-runs plain overrides only"
            )
    typed = re.findall(r"_target_\s*[=:]\s*['\"]?([^\s,'\"}]+)", " ".join(run.task_overrides))
    for target in [*targets_in(run.config), *typed]:
        if not (isinstance(target, str) and DOTTED_NAME.fullmatch(target) and trust.trusts(target)):
            raise UserError(
                f"{run.dir}: its config names the target {target!r}, which no config file here names and "
                "conf/trusted_targets.yaml does not trust, so it is not run: if you trust that code, add it to "
                "conf/trusted_targets.yaml"
            )


def rerun_overrides(run: RecordedRun, searchpath: list[str], verify_dir: Path, steps: int | None) -> list[str]:
    """The overrides that train the run again in `verify_dir`: its own, from step 0 (a resumed run's checkpoint is
    not read: the whole run is replayed), without loggers, for `steps` steps where given."""
    kept = [
        o for o in run.task_overrides if re.split(r"[=.@]", o.lstrip("+~"), maxsplit=1)[0] not in REPLACED_OVERRIDES
    ]
    stop = [] if steps is None else ["+callbacks.verify_steps._target_=project.verify.StopAfterSteps"]
    stop += [] if steps is None else [f"+callbacks.verify_steps.steps={steps}"]
    search = [ONE_JOB_OF_A_SEARCH] if any(o.startswith("hparams_search=") for o in kept) else []
    return [*searchpath, *kept, *search, "logger=none", *stop, f"hydra.run.dir={verify_dir}"]


def first_difference(then: list[float], now: list[float]) -> tuple[int, bool] | None:
    """(index, within tolerance) of the first loss of `now` not bitwise `then`'s; None where all are."""
    for index, (old, new) in enumerate(zip(then, now, strict=False)):
        if old != new and not (math.isnan(old) and math.isnan(new)):
            close = math.isclose(old, new, rel_tol=RELATIVE_TOLERANCE)
            if not close:
                return index, False
            later = first_difference(then[index + 1 :], now[index + 1 :])
            return (index, True) if later is None or later[1] else (index + 1 + later[0], False)
    return None


def compare_losses(then: list[dict], now: list[dict], steps: int | None) -> tuple[str, bool, int]:
    """(what the per-step losses show, whether they reproduce, the steps compared per rank)."""
    if len(then) != len(now):
        return f"another number of processes: {len(then)} then, {len(now)} now", False, 0
    verdicts, compared = [], 0
    for rank, (old, new) in enumerate(zip(then, now, strict=True)):
        first = old["first_step"]
        replayed = new["step_losses"][first:]
        recorded = old["step_losses"][: len(replayed)] if steps is not None else old["step_losses"]
        if steps is None and len(replayed) != len(recorded):
            return f"rank {rank} trained {len(replayed)} steps now, {len(recorded)} then", False, 0
        compared = len(recorded)
        found = first_difference(recorded, replayed)
        if found is not None:
            verdicts.append((found[0] + first, rank, found[1], recorded[found[0]], replayed[found[0]]))
    bad = sorted(v for v in verdicts if not v[2])
    if bad:
        step, rank, _, old_loss, new_loss = bad[0]
        return f"differs from step {step + 1} (rank {rank}: loss {old_loss!r} then, {new_loss!r} now)", False, compared
    if verdicts:
        return f"reproduced within tolerance (relative {RELATIVE_TOLERANCE:g})", True, compared
    return "reproduced bitwise", True, compared


def compare_results(then: dict | None, now: dict | None) -> tuple[str, bool]:
    """What the final metrics show: each logged metric of `then` against `now`'s."""
    if then is None or now is None:
        return "final metrics not compared (results.json missing)", True
    old, new = logged_metrics(then), logged_metrics(now)
    moved = [
        name
        for name, value in old.items()
        if new.get(name) != value and not (isinstance(value, float) and math.isnan(value) and math.isnan(new[name]))
    ]
    close = all(
        isinstance(old[name], (int, float))
        and isinstance(new.get(name), (int, float))
        and math.isclose(old[name], new[name], rel_tol=RELATIVE_TOLERANCE)
        for name in moved
    )
    if not moved:
        return f"the {len(old)} final metrics equal", True
    shown_moved = ", ".join(f"{name} {old[name]!r} → {new.get(name)!r}" for name in moved[:4])
    return f"final metrics {'within tolerance' if close else 'differ'}: {shown_moved}", close


def patch_by_file(text: str) -> dict[str, str]:
    """A `git diff`'s text, file by file."""
    files: dict[str, str] = {}
    for part in re.split(r"^(?=diff --git )", text, flags=re.MULTILINE):
        match = re.match(r"diff --git a/(\S+) b/", part)
        if match:
            files[match.group(1)] = part
    return files


def recorded_patch(run_dir: Path, code: dict) -> str:
    """The uncommitted diff a receipt kept, read only from inside `run_dir`."""
    name = code.get("uncommitted_diff")
    if not isinstance(name, str) or not plain_path_inside(str(run_dir / name), run_dir):
        return ""
    try:
        return (run_dir / name).read_text(errors="replace")
    except OSError:
        return ""


def changed_files(then: dict, now: dict, then_dir: Path, now_dir: Path) -> list[str]:
    """The files that changed between the two runs: a target's file whose hash moved, a file whose uncommitted
    change differs, or (where the commits differ) a file the commits differ in."""
    changed = []
    old_files, new_files = then.get("target_files") or {}, now.get("target_files") or {}
    for name, entry in new_files.items():
        old = old_files.get(name)
        if isinstance(old, dict) and old.get("sha256") != entry.get("sha256"):
            changed.append(f"{name} (sha256 {str(old.get('sha256'))[:12]} → {str(entry.get('sha256'))[:12]})")
    old_patch, new_patch = patch_by_file(recorded_patch(then_dir, then)), patch_by_file(recorded_patch(now_dir, now))
    named = {entry.split(" ")[0] for entry in changed}
    changed += [
        f"{name} (uncommitted change)"
        for name in sorted(old_patch.keys() | new_patch.keys())
        if old_patch.get(name) != new_patch.get(name) and name not in named
    ]
    if then.get("commit") and now.get("commit") and then["commit"] != now["commit"]:
        changed.insert(0, f"commit {str(then['commit'])[:12]} → {str(now['commit'])[:12]}")
    return changed


def moved_versions(then: dict, now: dict) -> list[str]:
    """`torch 2.14.1 → 2.15.0`, per version that moved: Python, torch's CUDA and cuDNN, each distribution."""
    pairs = [("python", then.get("python"), now.get("python"))]
    old_torch, new_torch = then.get("torch") or {}, now.get("torch") or {}
    pairs += [(f"torch {key}", old_torch.get(key), new_torch.get(key)) for key in ("cuda", "cudnn", "nccl")]
    old_packages, new_packages = then.get("distributions") or {}, now.get("distributions") or {}
    pairs += [(name, old_packages.get(name), new_packages.get(name)) for name in sorted(old_packages | new_packages)]
    moved = [f"{name} {old or 'absent'} → {new or 'absent'}" for name, old, new in pairs if old != new]
    if len(moved) > VERSIONS_SHOWN:
        moved = [*moved[:VERSIONS_SHOWN], f"and {len(moved) - VERSIONS_SHOWN} more"]
    return moved


def machine_line(machine: dict) -> str:
    cpu = machine.get("cpu") or {}
    gpus = ", ".join(gpu.get("name", "?") for gpu in machine.get("gpus") or []) or "no GPU"
    return f"{machine.get('host')}, {cpu.get('model')} ({cpu.get('isa_level')}), {cpu.get('cores_given')} cores, {gpus}"


def receipt_differences(run: RecordedRun, rerun: RecordedRun) -> list[str]:
    """What differs between the original's receipt and the re-run's, a line each."""
    if run.receipt is None:
        return ["receipt missing (a run from before receipts): compared by its config and history alone"]
    lines = [
        f"changed since: {entry}"
        for entry in changed_files(run.segment("code"), rerun.segment("code"), run.dir, rerun.dir)
    ]
    lines += [
        f"version moved: {entry}" for entry in moved_versions(run.segment("environment"), rerun.segment("environment"))
    ]
    old_lock = (run.segment("environment").get("lock_file") or {}).get("sha256")
    new_lock = (rerun.segment("environment").get("lock_file") or {}).get("sha256")
    if old_lock != new_lock:
        lines.append("the lock file (constraints-py*.txt) changed")
    old_machine, new_machine = machine_line(run.segment("machine")), machine_line(rerun.segment("machine"))
    if old_machine != new_machine:
        lines.append(f"another machine: {old_machine} → {new_machine}")
    old_size, new_size = run.segment("launch").get("world_size"), rerun.segment("launch").get("world_size")
    if old_size != new_size:
        lines.append(f"another world size: {old_size} → {new_size}")
    if len(run.receipt) > 1:
        lines.append(f"the run was started {len(run.receipt)} times (resumed): the re-run trains it whole, from step 0")
    return lines


def unrecorded_start(run: RecordedRun) -> str:
    """Where the run's history starts after step 0, the steps before it were not compared, and the verdict says so: a
    run resumed from another run's checkpoint (or from one saved mid-epoch) holds only its own steps; one resumed in
    its own dir from an epoch-end checkpoint holds them all (project.engine.history.history_carried_on)."""
    first = run.histories[0]["first_step"]
    if first == 0:
        return ""
    return f", from step {first + 1} on (its history starts where it resumed: the steps before are not in it)"


def verify_dir_of(run_dir: Path) -> Path:
    """A new `<run dir>/verify/<time>` (`-1`, `-2`, ... where another verification took that second)."""
    parent = run_dir / "verify"
    parent.mkdir(exist_ok=True)
    name = time.strftime("%Y-%m-%d_%H-%M-%S")
    candidate, suffix = parent / name, 0
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            suffix += 1
            candidate = parent / f"{name}-{suffix}"


def pruned_at(run: RecordedRun) -> int | None:
    """The steps a trial had trained when its search's pruner stopped it (its history's end), else None: its re-run,
    which no pruner reaches, stops there."""
    if not (run.dir / PRUNED_FILE).is_file() or not run.histories:
        return None
    history = run.histories[0]
    return history["first_step"] + len(history["step_losses"])


def verify(run_dir: Path, steps: int | None, searchpaths: list[Path] = ()) -> bool:
    """Re-run the run in `run_dir` and print what differs and the verdict; whether it reproduced."""
    run = RecordedRun(run_dir)
    run.check_finished()
    pruned = pruned_at(run) if steps is None else None
    steps = pruned or steps
    launcher = run.launcher_here()
    searchpath, folders = searchpaths_of(run, list(searchpaths))
    check_trusted(run, folders)
    refuse_a_download(run)
    verify_dir = verify_dir_of(run_dir)
    overrides = rerun_overrides(run, searchpath, verify_dir, steps)
    print(f"verify: {shown(run_dir)}, re-run in {shown(verify_dir)}", flush=True)
    with open(verify_dir / "rerun.log", "w") as log:
        command = [*launcher, sys.executable, "-m", "project.train", *overrides]
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (verify_dir / "rerun.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"the re-run failed (exit {done.returncode}: {tail[0]}); its output: {verify_dir}/rerun.log")
    rerun = RecordedRun(verify_dir)
    for line in receipt_differences(run, rerun):
        print(f"  {line}")
    losses, reproduced, compared = compare_losses(run.histories, rerun.histories, steps)
    if steps is None:
        results, same = compare_results(run.results, rerun.results)
        reproduced = reproduced and same
        print(f"  {results}")
    only = f" (the first {steps} steps only: --steps {steps}; final metrics not compared)" if steps else ""
    if pruned:
        only = f" (its search's pruner stopped it after step {steps}, and the re-run there; final metrics not compared)"
    print(f"{losses}: {compared} step(s) on each of {len(run.histories)} process(es){only}{unrecorded_start(run)}")
    return reproduced


def main(argv: list[str] | None = None) -> None:
    try:
        arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
        reproduced = verify(arguments.run_dir, arguments.steps, arguments.searchpath)
    except UserError as error:
        print(error_line(error), file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if reproduced else 1)


if __name__ == "__main__":
    main()
