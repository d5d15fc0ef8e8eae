"""Every private name of Lightning, torch, Hydra and OmegaConf the project uses, and every call that differs between
Hydra 1.3 and 1.4 or OmegaConf 2.3 and 2.4, each with the issue or version that removes it; and the library messages
that tell this project's user nothing, silenced by their text."""

import copyreg
import functools
import importlib
import inspect
import logging
import os
import re
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import hydra
import hydra.utils
import lightning as L
import omegaconf

# Lightning 2.6's private names (hence `lightning<2.7` in pyproject.toml); each goes where its note below says.
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric
from lightning.pytorch.utilities.data import _update_dataloader
from omegaconf import DictConfig, OmegaConf

# Hydra 1.4's execution whitelist (`instantiate(_execution_whitelist_=...)`, `hydra.main(execution_whitelist=...)`).
HAS_EXECUTION_WHITELIST = hasattr(hydra.utils, "execution_whitelist")
# What to pass to `hydra.main`, `initialize`, `initialize_config_dir`: Hydra 1.3 warns without it, 1.4 deprecates it.
VERSION_BASE: dict[str, str] = {} if HAS_EXECUTION_WHITELIST else {"version_base": "1.3"}
OMEGACONF_2_4 = tuple(int(part) for part in omegaconf.__version__.split(".")[:2]) >= (2, 4)

# Library warnings that tell a user of this project nothing: (message regex, why, what ends it upstream).
WARNINGS = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "torch 2.14 deprecates a check lightning/pytorch/utilities/_pytree.py still makes",
        "Lightning-AI/pytorch-lightning#21326 (closed; no release up to 2.6.6 has the fix)",
    ),
)
# Silenced only outside a Slurm allocation (no SLURM_JOB_ID): inside one, the hint can save a hang.
OUTSIDE_SLURM_WARNINGS = (
    (
        r"The `srun` command is available on your system but is not used",
        "Lightning's hint on a machine that has Slurm installed",
        "lightning/fabric/plugins/environments/slurm.py, any version so far",
    ),
)
# Log records, by the logger that emits them.
LOG_MESSAGES = (
    (
        "lightning.pytorch.utilities.rank_zero",
        r"💡 Tip: For seamless cloud logging",
        "an advertisement for a hosted logger, on every run",
        "lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py since 2.6",
    ),
    (
        "torch.utils.cpp_extension",
        r"No CUDA runtime is found, using CUDA_HOME=",
        "printed by torch.compile's C++ compiler set-up (compile=true) on every machine without a GPU",
        "torch/utils/cpp_extension.py, any version so far",
    ),
)
# Where in a run memory ran out, by the private function that ran: Lightning 2.6's Trainer's, Hydra 1.3/1.4's.
STAGE_FUNCTIONS = {
    "_call_target": "while building the run",
    "_fit_impl": "while training",
    "_validate_impl": "while validating",
    "_test_impl": "while testing",
    "_predict_impl": "while predicting",
}
# What a torch 2.14 learning-rate schedule's `state_dict` holds as it steps (some of it private attributes), not as it
# was built, and its `base_lrs` (the groups' `initial_lr`): what a schedule changed on resume is compared without.
SCHEDULE_PROGRESS = frozenset(
    ("last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial", "best", "num_bad_epochs")
    + ("cooldown_counter", "base_lrs")
)
# Hydra's default (grid) sweeper; a sweep under any other is a search. Its class path in Hydra 1.3 and 1.4.
GRID_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
# The classes torch 2.14 DCP's index of shards (`.metadata`) pickles, which `checkpoints.ShardsIndexUnpickler` allows.
SHARDS_INDEX_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


def plain_partial(factory: functools.partial) -> tuple:
    """Pickle a Hydra 1.4 `_partial_` factory as a plain `functools.partial` of the same call."""
    return functools.partial(factory.func, *factory.args, **factory.keywords).__reduce__()


# Hydra 1.4 refuses to pickle its private `_DeferredTarget` (trainer=ddp_spawn pickles the module): goes when Hydra
# pickles them, or when no strategy offered pickles the module.
if HAS_EXECUTION_WHITELIST:
    from hydra._internal.execution_policy import _DeferredTarget

    copyreg.pickle(_DeferredTarget, plain_partial)


def with_sampler(loader: Any, sampler: Any) -> Any:
    """`loader` made again with `sampler` in place of its own, everything else as its maker gave it (its class, dataset,
    batch size, collate_fn, workers): Lightning's private `_update_dataloader`, as it puts a `DistributedSampler` in a
    loader it is handed, from the arguments it records while a data hook runs (Lightning 2.6; no public
    equivalent)."""
    return _update_dataloader(loader, sampler)


def hydra_main(config_path: str, config_name: str, job_whitelist: Callable[[DictConfig], list[str]]) -> Callable:
    """`@hydra.main` on either Hydra; on 1.4 the job's `instantiate`s run under `job_whitelist(cfg)`, Hydra's own
    before the job under none (the composed config is the user's)."""
    if not HAS_EXECUTION_WHITELIST:
        return hydra.main(config_path=config_path, config_name=config_name, **VERSION_BASE)

    def decorate(task: Callable[[DictConfig], Any]) -> Callable:
        @functools.wraps(task)
        def job(cfg: DictConfig) -> Any:
            try:
                whitelist = job_whitelist(cfg)
            except Exception:  # a config that cannot be read (a `${...}` naming nothing): the job says so in one line
                return task(cfg)
            with execution_whitelist(lambda: whitelist):
                return task(cfg)

        unchecked = hydra.utils.UNSAFE_DISABLE_EXECUTION_CHECKS
        return hydra.main(config_path=config_path, config_name=config_name, execution_whitelist=unchecked)(job)

    return decorate


def execution_whitelist(targets: Callable[[], list[str]]) -> AbstractContextManager:
    """Hydra 1.4's whitelist `targets()` (each with the name it is defined under) for every `instantiate` inside, in
    place of the one around it; nothing on Hydra 1.3."""
    if not HAS_EXECUTION_WHITELIST:
        return nullcontext()
    listed = targets()
    defined_as = [defined_name(located(target)) for target in listed if not target.endswith(".*")]
    return hydra.utils.execution_whitelist([*listed, *filter(None, defined_as)], reset=True)


def defined_name(found: Any) -> str | None:
    """`<module>.<qualified name>` of a class or function; None for anything else."""
    if not (inspect.isclass(found) or inspect.isfunction(found)):
        return None
    return f"{found.__module__}.{found.__qualname__}"


def located(target: str) -> Any:
    """What the dotted name `target` names, found (and imported) as Hydra finds a target; None where nothing is."""
    parts = target.split(".")
    try:
        found = importlib.import_module(parts[0])
    except ImportError:
        return None
    for index, part in enumerate(parts[1:], start=1):
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        if not inspect.ismodule(found):
            return None
        try:
            found = importlib.import_module(".".join(parts[: index + 1]))
        except ImportError:
            return None
    return found


def register_resolver(name: str, resolver: Callable, replace: bool = False, use_cache: bool = False) -> None:
    """`${name:...}` calls `resolver`, on OmegaConf 2.3 (`register_new_resolver`) and 2.4 (`register_resolver`)."""
    register = OmegaConf.register_resolver if OMEGACONF_2_4 else OmegaConf.register_new_resolver
    register(name, resolver, replace=replace, use_cache=use_cache)


def config_root(node: Any) -> Any:
    """The whole config a node belongs to (private in OmegaConf 2.3 and 2.4, which have no public one)."""
    return node._get_root()


class DropMessages(logging.Filter):
    def __init__(self, patterns: list[str]) -> None:
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{pattern})" for pattern in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.match(record.getMessage()) is None


def silence_upstream_noise() -> None:
    """Install the filters (`project` calls this once, as it is imported)."""
    listed = WARNINGS if "SLURM_JOB_ID" in os.environ else WARNINGS + OUTSIDE_SLURM_WARNINGS
    for pattern, _, _ in listed:
        warnings.filterwarnings("ignore", message=pattern)
    for name in {name for name, _, _, _ in LOG_MESSAGES}:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, DropMessages) for existing in logger.filters):
            logger.addFilter(DropMessages([pattern for emitter, pattern, _, _ in LOG_MESSAGES if emitter == name]))


def mean_of_samples(metric: _ResultMetric) -> Any:
    """A logged metric's mean over every process's samples, for `_ResultMetric.compute` (Lightning 2.6).

    Lightning mean-reduces (sums and divides by the process count) a metric logged with `sync_dist=True` and, the
    same way, its count of samples, which it keeps in an integer tensor: where the processes counted different
    numbers of samples (a validation set that does not split evenly, served without repeats: `ddp.evaluated_once`),
    the division floors the count, and every such metric comes out too large (23 samples on 2 processes: 15/22 in
    place of 15/23). Here the count is reduced as a float, on a copy (Lightning reduces it in place).
    Lightning-AI/pytorch-lightning#21859 (open), fixed by #21839.
    """
    if metric.is_tensor and metric.meta.is_mean_reduction:
        value = metric.meta.sync(metric.value.clone())
        return value / metric.meta.sync(metric.cumulated_batch_size.to(value.dtype))
    return LIGHTNINGS_COMPUTE(metric)


# Lightning 2.6's own `_ResultMetric.compute`, for what `mean_of_samples` leaves to it (#21859).
LIGHTNINGS_COMPUTE = _ResultMetric.compute


def count_samples_exactly() -> None:
    """Have Lightning's logged metrics use `mean_of_samples` (`project` calls this once, as it is imported; each
    metric wraps the method when it is made): Lightning 2.6, until Lightning-AI/pytorch-lightning#21859 is fixed."""
    _ResultMetric.compute = mean_of_samples


# Lightning 2.6's launchers lower the threads per process this way; a launcher replacing one must too.
set_num_threads_if_needed = _set_num_threads_if_needed


class ScriptLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher that re-runs `sys.argv` for ranks 1..N-1 (Lightning-AI/pytorch-lightning#18175)."""

    def check_can_spawn_children(self) -> None:
        self._check_can_spawn_children()


class OwnScriptLauncher:
    """Mixed into a strategy before Lightning's: its `script_launcher()` replaces Lightning's script launcher
    (Lightning-AI/pytorch-lightning#18175)."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if isinstance(self._launcher, _SubprocessScriptLauncher):
            self._launcher = self.script_launcher()


def is_spawn_launcher(launcher: object) -> bool:
    """Whether a strategy's launcher is ddp_spawn's (private class in Lightning 2.6)."""
    return isinstance(launcher, _MultiProcessingLauncher)


def strategy_timeout(strategy: Any) -> Any:
    """A DDP or FSDP strategy's process-group timeout, a `timedelta` or None (private in Lightning 2.6)."""
    return strategy._timeout


def skip_lightning_sigterm_broadcast(trainer: L.Trainer) -> None:
    """Skip the SIGTERM broadcast Lightning 2.6 makes before every training batch, for strategies that agree on
    SIGTERM themselves (Lightning-AI/pytorch-lightning#21487)."""
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None


def replace_sigterm_notifier(trainer: L.Trainer, notifier: Callable[[int, object], None]) -> None:
    """Make `notifier` the Trainer's SIGTERM handler, in place of Lightning 2.6's, which broadcasts from inside it."""
    trainer._signal_connector._sigterm_notifier_fn = notifier


def flag_sigterm(trainer: L.Trainer) -> None:
    """Set the flag Lightning 2.6's loops stop on after SIGTERM."""
    trainer._signal_connector.received_sigterm = True


class TopKCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` that calls `monitor_not_logged` where Lightning 2.6 raises for a monitored metric not
    logged."""

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        if self.monitor is None or self.monitor in monitor_candidates:
            super()._save_topk_checkpoint(trainer, monitor_candidates)
        else:
            self.monitor_not_logged(trainer, monitor_candidates)


def open_tqdm_bars(bar: TQDMProgressBar) -> list:
    """The bars a `TQDMProgressBar` holds open (private in Lightning 2.6, which never closes them on an exception)."""
    held = (bar._train_progress_bar, bar._val_progress_bar, bar._test_progress_bar, bar._predict_progress_bar)
    return [tqdm for tqdm in held if tqdm is not None]
