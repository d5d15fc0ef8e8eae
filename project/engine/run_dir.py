"""The run directory: one per launch, named alike by each of its processes (`${launch_dir:}`) and claimed so that no
other launch writes there; one given on the command line is checked as the run starts (`RunDirCheck`)."""

import contextlib
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from project.engine.errors import UserError, refuse
from project.engine.run_log import process_rank, report
from project.engine.sweeps import check_same_sweep
from project.engine.trusted_targets import targets_in
from project.engine.upstream import register_resolver

TIME_FORMAT = "%Y-%m-%d/%H-%M-%S"
# The file in a run dir that says which launch it belongs to.
CLAIM_FILE = ".launch_id"
# The directories this process claimed as it named them (`launch_dir`).
CLAIMED_HERE: set[Path] = set()


def process_start_time(pid: int) -> float:
    """Seconds since the epoch at which process `pid` started (Linux `/proc`)."""
    ticks_since_boot = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot_time = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return boot_time + ticks_since_boot / os.sysconf("SC_CLK_TCK")


def is_slurm_task() -> bool:
    """Whether `srun` started this very process as a task (not a shell in `salloc`)."""
    return "SLURM_STEP_ID" in os.environ and os.environ.get("SLURM_TASK_PID") == str(os.getpid())


def multi_node_torchrun() -> bool:
    """Whether torchrun started this process as a worker of a launch that spans several nodes."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return "TORCHELASTIC_RUN_ID" in os.environ and world_size > int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def torchrun_run_name() -> str:
    """`--rdzv-id` as a directory name; torchrun's default, "none", is refused: every launch would share it."""
    run_id = os.environ["TORCHELASTIC_RUN_ID"]
    if run_id == "none":
        refuse(
            "a multi-node torchrun launch needs --rdzv-id=<a name for this run> (the same on every node): "
            "its run directory, outputs/torchrun-<name>, is named after it"
        )
    return re.sub(r"[^\w.-]", "_", run_id)


def launch_id() -> str:
    """What names this process's launch in a claim: shared by the processes of a Slurm job step or a torchrun launch
    and by their restarts (which so find their directory theirs again), new for any other process."""
    if is_slurm_task():
        return f"slurm {os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    if multi_node_torchrun():
        return f"torchrun {torchrun_run_name()}"
    if "TORCHELASTIC_RUN_ID" in os.environ:
        agent = os.getppid()
        return f"torchrun {agent} {process_start_time(agent)}"
    return f"process {os.getpid()} {time.time_ns()}"


def claim(directory: Path, launch_id: str) -> bool:
    """Make `directory` this launch's unless another launch has; whether it is ours. Linked into place whole, the claim
    file goes to exactly one of the launches racing for it."""
    directory.mkdir(parents=True, exist_ok=True)
    claim_file = directory / CLAIM_FILE
    draft = directory / f".{CLAIM_FILE}.{socket.gethostname()}.{os.getpid()}"  # hosts can share pids (containers)
    draft.write_text(launch_id)
    try:
        os.link(draft, claim_file)
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return claim_file.read_text() == launch_id


def claimed(name: str, launch_id: str) -> str:
    """`name`, or the first of `name-1`, `name-2`, ... that is not another launch's, claimed for `launch_id`."""
    candidate, suffix = name, 0
    while not claim(Path(candidate), launch_id):
        suffix += 1
        candidate = f"{name}-{suffix}"
    CLAIMED_HERE.add(Path(candidate).resolve())
    return candidate


def launch_dir(parent: str = "outputs") -> str:
    """This process's run (or sweep) directory below `parent`, claimed for its launch: named after the Slurm step,
    the torchrun `--rdzv-id`, the torchrun agent's start, or now."""
    if is_slurm_task():
        return f"{parent}/slurm-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    if multi_node_torchrun():
        return claimed(f"{parent}/torchrun-{torchrun_run_name()}", launch_id())
    started = process_start_time(os.getppid()) if "TORCHELASTIC_RUN_ID" in os.environ else time.time()
    return claimed(f"{parent}/{time.strftime(TIME_FORMAT, time.localtime(started))}", launch_id())


def on_rank_zero(value: str) -> str | None:
    """`value` in the rank-0 process, None (Hydra: "don't write") in the others."""
    return value if process_rank() == 0 else None


def rank_log_suffix() -> str:
    """ "" for rank 0, ".rank<N>" for the others: each process logs to its own file in the shared run dir."""
    rank = process_rank()
    return f".rank{rank}" if rank else ""


def register_resolvers() -> None:
    resolvers = {"launch_dir": launch_dir, "on_rank_zero": on_rank_zero, "rank_log_suffix": rank_log_suffix}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            register_resolver(name, resolver, use_cache=True)


def names_a_url(path: object) -> bool:
    """Whether `path` is a URL or an fsspec chain (`http://`, `s3://`, fsspec's `local://`, `simplecache::`), which
    Lightning and torch.hub would open through the network or another file system, not as a local path."""
    return "://" in str(path) or "::" in str(path)


def plain_path_inside(path: object, directory: str | Path) -> bool:
    """Whether `path`, read from a file (a checkpoint's callback state, a study's job dir), is plainly a place inside
    `directory`: a local path (no URL, no `~`) that resolves inside `directory`, `..` and symbolic links followed
    as the kernel would follow them, a relative one from the working directory as Lightning takes it. Nothing is
    opened: another run's or machine's path is judged by its name and this machine's links alone."""
    if not isinstance(path, str) or not path or names_a_url(path) or path.startswith("~") or "\0" in path:
        return False
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def carries_on(directory: Path, ckpt_path: str | None) -> bool:
    """Whether a run in `directory` resumes the run already there: `ckpt_path=last` (its own last.ckpt), or a
    checkpoint inside it."""
    if ckpt_path == "last":
        return (directory / "checkpoints" / "last.ckpt").is_file()
    return ckpt_path is not None and directory.resolve() in Path(ckpt_path).resolve().parents


def check_run_dir_is_this_runs(directory: Path, ckpt_path: str | None) -> None:
    """End, in one line, a run told to write into a directory that holds another run, unless it carries that run on
    or its own launch claimed it (an earlier attempt of it too); then claim it. Rank 0 alone asks."""
    claim_file = directory / CLAIM_FILE
    this_launch = launch_id()
    if directory.resolve() in CLAIMED_HERE or (claim_file.is_file() and claim_file.read_text() == this_launch):
        return
    checkpoints = directory / "checkpoints"
    found = ["results.json"] if (directory / "results.json").is_file() else []
    if checkpoints.is_dir() and any(path.is_file() for path in checkpoints.iterdir()):
        found.append("checkpoints/")
    if found and not carries_on(directory, ckpt_path):
        refuse(
            f"hydra.run.dir={directory} already holds another run ({', '.join(found)}), which this run would "
            "write over: give a new directory, or carry that run on with ckpt_path=last"
        )
    claim_file.write_text(this_launch)


class RunDirCheck(Callback):
    """Before a run starts, make its directory or end in one line naming it; refuse a run directory that holds another
    run (`check_run_dir_is_this_runs`) and a sweep directory that holds another sweep (`check_same_sweep`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.make(config.hydra.run.dir, "hydra.run.dir")
        if process_rank() == 0:
            check_run_dir_is_this_runs(Path(config.hydra.run.dir), config.get("ckpt_path"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.make(config.hydra.sweep.dir, "hydra.sweep.dir")
        check_same_sweep(config)

    @staticmethod
    def make(directory: str, key: str) -> None:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            problem = None if os.access(directory, os.W_OK) else "it exists but cannot be written"
        except OSError as error:
            problem = error.strerror
        if problem is not None:  # an existing one Hydra's log file would fail in, with logging's traceback
            refuse(
                f"the run's directory {directory} cannot be made or written in ({problem}): give {key} a "
                "directory you can write, or run from one"
            )


def shown(directory: Path) -> str:
    """`directory` relative to the working directory where it lies below it (`outputs/...`), else absolute."""
    absolute, here = directory.resolve(), Path.cwd().resolve()
    return str(absolute.relative_to(here)) if absolute.is_relative_to(here) else str(absolute)


# The receipt (docs/reproducibility.md): what made a run, written as it starts, one segment per start of it. Rank 0
# writes `receipt.json` with the code, environment, machine and launch; each other rank, `receipt.rank<N>.json` with
# its own machine (another node's host, CPU and GPUs). Files the receipt keeps (the uncommitted diff, untracked and
# out-of-tree source) lie in `receipt/<segment>/`.
RECEIPT_FILE = "receipt.json"
RECEIPT_FORMAT = "project receipt 1"
RECEIPT_FOLDER = "receipt"
# What is copied into a segment's folder at most: a source tree's files, not a data set someone left untracked.
COPY_CAP_BYTES = 10 * 2**20
# Untracked files copied: source and config, never a `.env`, a key or a data file.
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".toml")
# A git that waits longer (a network file system, a hook) is recorded as having failed; the run goes on.
GIT_SECONDS = 5.0
# The only environment variables recorded, by exact name: those that change numbers or what runs where. A secret
# (WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, a token) is never one of them.
NUMERICS_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "PYTHONHASHSEED",
)
# The launchers' own ids and counts, by exact name.
LAUNCH_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_STEP_ID",
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_JOB_NODELIST",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "NODE_RANK",
)
# x86-64 micro-architecture levels, by the /proc/cpuinfo flags each adds (psABI): kernels torch picks differ by level.
ISA_LEVELS = (
    ("x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}),
    ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
)


class GitFailed(Exception):
    """git is missing, slow, or answered with an error: the receipt says which, the run goes on."""


def git(tree: Path, *arguments: str) -> bytes:
    """git's output for `arguments` in `tree`: no shell, no prompt (a credential helper, an editor), no lock taken,
    at most `GIT_SECONDS`."""
    environment = os.environ | {"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", "-C", str(tree), *arguments],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=GIT_SECONDS,
            env=environment,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise GitFailed(f"git {arguments[0]}: {error}") from None
    if done.returncode != 0:
        first_line = (done.stderr.decode(errors="replace").strip().splitlines() or ["failed"])[0]
        raise GitFailed(f"git {arguments[0]}: {first_line}")
    return done.stdout


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class ReceiptFolder:
    """A segment's folder of kept files, filled until `COPY_CAP_BYTES`: the first file over it is named once, in a
    warning and in the receipt, and no later file is kept."""

    root: Path
    used: int = 0
    cap_reached: str | None = None

    def keep(self, name: str, content: bytes) -> str | None:
        """`content` kept as `name` (a relative path), or None where the cap was reached; the path kept."""
        if self.cap_reached is None and self.used + len(content) > COPY_CAP_BYTES:
            self.cap_reached = f"{name} and later files not kept: over {COPY_CAP_BYTES / 2**20:g} MB"
            report(f"warning: the run's receipt keeps no copy of {self.cap_reached} (large untracked files?)")
        if self.cap_reached is not None:
            return None
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        self.used += len(content)
        return str(path.relative_to(self.root.parents[1]))


def git_facts(tree: Path, folder: ReceiptFolder) -> dict:
    """The commit, branch and state of the repository holding `tree`; the uncommitted diff (staged and unstaged)
    and the untracked source files kept in `folder`. No git, or no repository: why, as `git`."""
    try:
        top = Path(git(tree, "rev-parse", "--show-toplevel").decode().strip())
        status = git(top, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "-z").decode(
            errors="surrogateescape"
        )
    except GitFailed as error:
        return {"git": str(error)}
    entries = status.split("\0")
    header = dict(entry[2:].split(" ", 1) for entry in entries if entry.startswith("# ") and " " in entry[2:])
    untracked = [entry[2:] for entry in entries if entry.startswith("? ")]
    dirty = any(entry[:2] in ("1 ", "2 ", "u ") for entry in entries)
    facts = {
        "git": "ok",
        "toplevel": str(top),
        "commit": header.get("branch.oid"),
        "branch": header.get("branch.head"),
        "dirty": dirty,
    }
    if dirty:
        try:
            facts["uncommitted_diff"] = folder.keep("uncommitted.patch", git(top, "diff", "HEAD", "--binary"))
        except GitFailed as error:
            facts["uncommitted_diff"] = str(error)
    sources = [name for name in untracked if name.endswith(SOURCE_SUFFIXES) and (top / name).is_file()]
    facts["untracked"] = {name: folder.keep(f"untracked/{name}", (top / name).read_bytes()) for name in sources}
    return facts


def installed_places() -> list[Path]:
    """Where installed packages and the standard library live: files there are named by the versions recorded."""
    paths = sysconfig.get_paths()
    return [Path(paths[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]


def defining_file(target: str) -> Path | None:
    """The file that defines `target`, among the modules imported already: nothing is imported to find it (a target
    not yet imported, or no module's, gives None)."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is None:
            continue
        found: Any = module
        for name in parts[end:]:
            found = getattr(found, name, None)
        if found is None:
            return None
        defined_in = sys.modules.get(getattr(found, "__module__", None) or "", module)
        file = getattr(defined_in, "__file__", None)
        return Path(file).resolve() if file else None
    return None


def target_files(targets: Iterable[str], top: Path | None, folder: ReceiptFolder) -> dict[str, dict]:
    """Per file defining one of `targets` (named by its path in the git tree `top`, else by its absolute path): its
    sha256 and targets, and where it is neither in the tree nor installed (a user's module on `PYTHONPATH`) a copy of
    it kept in `folder`."""
    files: dict[str, dict] = {}
    installed = installed_places()
    for target in sorted(set(targets)):
        path = defining_file(target)
        if path is None or not path.is_file():
            continue
        in_tree = top is not None and path.is_relative_to(top)
        name = str(path.relative_to(top)) if in_tree else str(path)
        entry = files.get(name)
        if entry is None:
            entry = files[name] = {"sha256": file_sha256(path), "targets": []}
            if not in_tree and not any(path.is_relative_to(place) for place in installed):
                entry["copy"] = folder.keep(f"outside{path}", path.read_bytes())
        entry["targets"].append(target)
    return files


def package_versions() -> dict[str, str]:
    """Every installed distribution, by the name its `.dist-info` (or `.egg-info`) folder spells (lower case), with
    its version; the first on `sys.path` wins, as for imports. Read from the folders' names: parsing every METADATA
    file, as `importlib.metadata` does, would be most of the receipt's cost to a run's start (bench/startup.py)."""
    versions: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:  # a zip, a path that is not there
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if dot and kind in ("dist-info", "egg-info") and "-" in stem:
                package, version = stem.split("-")[:2]
                versions.setdefault(package.lower(), version)
    return dict(sorted(versions.items()))


def torch_facts() -> dict:
    """torch's version, the CUDA, cuDNN and NCCL it runs with, and the settings that change its numbers."""
    facts: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": None,
        "threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.cuda.is_available():
        with contextlib.suppress(RuntimeError, AttributeError, TypeError):
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return facts


def environment_facts(tree: Path) -> dict:
    version = sys.version_info
    lock = tree / f"constraints-py{version.major}.{version.minor}.txt"
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "distributions": package_versions(),
        "torch": torch_facts(),
        "lock_file": {"name": lock.name, "sha256": file_sha256(lock)} if lock.is_file() else None,
        "variables": {name: os.environ[name] for name in NUMERICS_VARIABLES if name in os.environ},
    }


def cpu_facts() -> dict:
    """The CPU's model, x86-64 level and identity (from /proc/cpuinfo), and the cores this process may run on.

    A virtual machine may show a model name that hides its generation ("Intel(R) Xeon(R) Processor"): its cpuid
    family/model/stepping and a digest of its feature flags tell two such machines apart, as the kernels MKL and
    oneDNN pick (and so the last bits of a float32 result) may.
    """
    model, flags, fields = platform.processor() or platform.machine(), set(), {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    level = None
    for name, needs in ISA_LEVELS:
        if not needs <= flags:
            break
        level = name
    cpuid = "/".join(fields[key] for key in ("cpu family", "model", "stepping") if key in fields) or None
    return {
        "model": fields.get("model name", model),
        "architecture": platform.machine(),
        "isa_level": level,
        "cpuid": f"{fields.get('vendor_id', '?')} {cpuid}" if cpuid else None,
        "features_sha256": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12] if flags else None,
        "cores_given": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cores": os.cpu_count(),
    }


def memory_bytes() -> int | None:
    try:
        line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def gpu_facts() -> list[dict]:
    """Each visible GPU's name, memory, compute capability, and the driver."""
    if not torch.cuda.is_available():
        return []
    try:
        driver = re.search(r"Kernel Module\s+([\d.]+)", Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        driver = None
    gpus = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "name": properties.name,
                "memory_bytes": properties.total_memory,
                "capability": f"{properties.major}.{properties.minor}",
                "driver": driver.group(1) if driver else None,
            }
        )
    return gpus


def machine_facts() -> dict:
    return {
        "host": socket.gethostname(),
        "rank": process_rank(),
        "cpu": cpu_facts(),
        "memory_bytes": memory_bytes(),
        "gpus": gpu_facts(),
        "variables": {name: os.environ[name] for name in NUMERICS_VARIABLES if name in os.environ},
    }


def launch_facts(launch: dict) -> dict:
    """How this start of the run came about: the command as typed, its overrides, the launcher's ids, and `launch`
    (world size, nodes, strategy, the checkpoint resumed from) as the entry point knows them."""
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(getattr(sys, "orig_argv", sys.argv)),
        "overrides": overrides,
        "working_directory": os.getcwd(),
        "pid": os.getpid(),
        "process_start": process_start_time(os.getpid()),
        "launcher": {name: os.environ[name] for name in LAUNCH_VARIABLES if name in os.environ},
        **launch,
    }


class ReceiptUnreadable(UserError):
    """A receipt.json that is not one this project wrote."""


def read_receipt(path: Path) -> dict:
    """The receipt at `path`; ReceiptUnreadable where it is not one this project wrote (truncated, corrupt, foreign)."""
    try:
        receipt = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ReceiptUnreadable(f"{path} cannot be read as a receipt ({error})") from None
    if not isinstance(receipt, dict) or receipt.get("format") != RECEIPT_FORMAT:
        raise ReceiptUnreadable(f"{path} is no receipt of this project (its format is not {RECEIPT_FORMAT!r})")
    segments = receipt.get("segments")
    if not isinstance(segments, list) or not segments or not all(isinstance(segment, dict) for segment in segments):
        raise ReceiptUnreadable(f"{path} holds no segments")
    return receipt


def segments_so_far(path: Path) -> list[dict]:
    """The segments of the receipt at `path` (a run carried on in its own dir), or none: an unreadable receipt is
    not carried on, and the new one says so."""
    if not path.is_file():
        return []
    try:
        return read_receipt(path)["segments"]
    except ReceiptUnreadable as error:
        return [{"unreadable_earlier_receipt": str(error)}]


def write_json_whole(path: Path, content: dict) -> None:
    """`content` at `path`, replaced whole: a reader never sees half a file, nor a crash leaves one."""
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    draft.write_text(json.dumps(content, indent=1))
    os.replace(draft, path)


def write_receipt(run_dir: str | Path, targets: Iterable[str], launch: dict) -> Path:
    """Add this start of the run to its receipt: rank 0 the code (for the `targets` the config names), environment,
    machine and launch (`launch_facts`), another rank its machine. Called before training, so that a run that
    crashes has one; where the run is carried on in its directory, the earlier segments stay."""
    rank = process_rank()
    directory = Path(run_dir)
    path = directory / (RECEIPT_FILE if rank == 0 else f"receipt.rank{rank}.json")
    segments = segments_so_far(path)
    if rank != 0:
        segments.append({"machine": machine_facts(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        write_json_whole(path, {"format": RECEIPT_FORMAT, "segments": segments})
        return path
    folder = ReceiptFolder(directory / RECEIPT_FOLDER / str(len(segments)))
    tree = Path(__file__).resolve().parents[2]  # the checkout holding the project package
    code = git_facts(tree, folder)
    top = Path(code["toplevel"]) if "toplevel" in code else None
    code["target_files"] = target_files(targets, top, folder)
    code["copy_cap_reached"] = folder.cap_reached
    segment = {
        "launch": launch_facts(launch),
        "code": code,
        "environment": environment_facts(top or tree),
        "machine": machine_facts(),
    }
    write_json_whole(path, {"format": RECEIPT_FORMAT, "segments": [*segments, segment]})
    return path


def launch_of(trainer: Any, checkpoint: str | None) -> dict:
    """What a run's Trainer says of its launch, for its receipt: processes, nodes, strategy, device, and the
    `checkpoint` it starts from (a resume's, or the one evaluated)."""
    return {
        "world_size": trainer.world_size,
        "nodes": trainer.num_nodes,
        "strategy": type(trainer.strategy).__name__,
        "accelerator": type(trainer.accelerator).__name__,
        "checkpoint": None if checkpoint is None else str(Path(checkpoint).resolve()),
    }


def targets_of(config: DictConfig, *built: object) -> list[str]:
    """The targets the run's `config` names, and the classes of the objects `built` from a checkpoint's stored config
    (project.evaluate and project.predict rebuild the trained run's network and data)."""
    classes = [f"{type(thing).__module__}.{type(thing).__qualname__}" for thing in built if thing is not None]
    return [*targets_in(OmegaConf.to_container(config, resolve=True)), *classes]
