"""The training loop the reference scripts share: build, train, evaluate, write the run's outputs.

It mirrors Lightning's defaults step by step (seed, then data, then network; forward, zero grad, backward, step,
schedule step; validation after every epoch) so that the two paths give the same numbers, and so do the everyday
Trainer settings that change them (`TrainerSettings`: clipping, accumulation, batch limits, bf16-mixed; any other is
refused). Like the Lightning path it writes `checkpoints/last.pt` at every epoch's end, every
`callbacks.mid_epoch_checkpoint.every_n_steps` steps and/or `every_n_minutes`, and when SIGTERM stops it (with
`accumulate_grad_batches`, at the end of the accumulation window it falls in); `ckpt_path=<that file>` resumes exactly
where it stood, because the training order's position is saved with the weights (`_save_checkpoint`). A NaN or
infinite loss or gradient stops it as it stops the Lightning path (`project.engine.history`).
"""

import contextlib
import inspect
import itertools
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter

from project.engine.build import instantiate_group
from project.engine.config import give_hints, switched_on
from project.engine.ddp import DeferredAgreement
from project.engine.errors import RunStopped, UserError
from project.engine.history import DivergenceWatch, TrainingHistory, first_learning_rate
from project.engine.reports import format_results_table, save_results
from project.engine.schedules import Schedule, build_schedule, check_resumable
from project.example.data import ClassificationDataModule
from project.example.data.training_order import TrainingPosition
from project.example.metrics import ClassificationTotals
from project.example.module import ClassifierModule


def pick_device(local_rank: int = 0) -> torch.device:
    """The tutorial's choice: a CUDA GPU if there is one, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def targets_subclass_of(node: object, expected: type) -> bool:
    """Whether config `node` has a `_target_` naming `expected` or a subclass of it (a misspelt class is no:
    instantiating it names it in one line)."""
    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        return False
    try:
        return issubclass(get_class(node._target_), expected)
    except (ImportError, ValueError):
        return False


def require_the_classifier(cfg: DictConfig) -> None:
    """Refuse, before anything trains, a model or data module that the reference path has no twin of.

    The reference scripts re-implement `ClassifierModule` (a `network`, an optimizer and schedule partial,
    cross-entropy and accuracy) on a `ClassificationDataModule` (its sampler, loaders and training position); a
    module or data module of another kind would train something else, so compare and parity mean nothing.
    """
    for group, expected in (("model", ClassifierModule), ("data", ClassificationDataModule)):
        if not targets_subclass_of(cfg[group], expected):
            raise UserError(
                f"{group}={cfg[group].get('_target_')} is not a {expected.__name__}: the reference path "
                "(project/optional/reference/: its scripts and compare) re-implements the classifier example only; "
                f"train your own {group} with python -m project.train, under any trainer="
            )


# Trainer keys that change nothing the two sides compute (where it runs, how long, what it prints and writes); the
# strategy is mirrored by the reference script REFERENCE_FOR_TRAINER picks.
HARMLESS_TRAINER_KEYS = {
    "_target_",
    "accelerator",
    "strategy",
    "devices",
    "num_nodes",
    "max_epochs",
    "log_every_n_steps",
    "default_root_dir",
    "deterministic",
    "plugins",
    "enable_progress_bar",
    "enable_model_summary",
    "num_sanity_val_steps",
}


# Trainer keys `TrainerSettings` mirrors, with the values it mirrors (None: every value Lightning takes).
MIRRORED_TRAINER_VALUES: dict[str, tuple | None] = {
    "gradient_clip_val": None,
    "gradient_clip_algorithm": None,
    "accumulate_grad_batches": None,
    "limit_train_batches": None,
    "limit_val_batches": None,
    "limit_test_batches": None,
    "check_val_every_n_epoch": None,
    "precision": ("32", "32-true", "bf16-mixed"),
}
# Settings outside trainer= that change what a Lightning run trains or reports, and the value the loop mirrors.
MIRRORED_RUN_SETTINGS = {"results_from": "last", "callbacks.early_stopping.enabled": False}


def require_what_the_reference_mirrors(cfg: DictConfig) -> None:
    """Refuse, before training, a Trainer setting that changes what Lightning computes and this loop has no
    counterpart of (it mirrors `TrainerSettings` only): the reference run would silently ignore it, and
    `project.optional.reference.compare` would show a difference by design."""
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(L.Trainer.__init__).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    for key, mirrored in MIRRORED_RUN_SETTINGS.items():
        value = OmegaConf.select(cfg, key)
        if value is not None and value != mirrored:
            value, mirrored = (str(v).lower() if isinstance(v, bool) else v for v in (value, mirrored))
            raise UserError(
                f"{key}={value} changes what the Lightning run trains or reports, and the reference path has no "
                f"counterpart of it: the two sides would differ by design; compare with {key}={mirrored}"
            )
    for key, value in cfg.trainer.items():
        if key in HARMLESS_TRAINER_KEYS or key not in defaults:
            continue
        default = defaults[key]
        if value == default or str(value) == str(default):
            continue
        mirrored = MIRRORED_TRAINER_VALUES.get(key, ())
        if mirrored is None or str(value) in mirrored:
            continue
        raise UserError(
            f"trainer.{key}={value} changes what Lightning trains, and the reference path has no counterpart of it "
            "(it mirrors gradient clipping, accumulate_grad_batches, limit_*_batches, check_val_every_n_epoch and "
            "bf16-mixed): the two sides "
            f"would differ by design; compare without it (Lightning's default is {key}={default})"
        )


def parse_batch_limit(limit: int | float | None, batches: int, key: str) -> int:
    """How many of a loader's `batches` Lightning uses under `trainer.<key>` (`_parse_num_batches`): an int is a
    count, a float a fraction (rounded down), null all of them."""
    if limit is None:
        return batches
    used = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
    if batches and not used:
        raise UserError(f"trainer.{key}={limit} leaves none of the {batches} batches: give a larger fraction")
    return used


@dataclass
class TrainerSettings:
    """The Trainer settings of conf/trainer/ that the loop mirrors, applied where Lightning applies them.

    Lightning (2.6, automatic optimization) divides each batch's loss by `accumulate_grad_batches` before backward,
    zeroes the gradients at each window's first batch, and clips and steps the optimizer at each window's last batch
    and at the epoch's last; `bf16-mixed` runs each training, validation and test step under `torch.autocast`.
    """

    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None  # norm (None) | value
    accumulate_grad_batches: int = 1
    limit_train_batches: int | float | None = None
    limit_val_batches: int | float | None = None
    limit_test_batches: int | float | None = None
    check_val_every_n_epoch: int = 1
    precision: str = "32-true"

    @classmethod
    def from_config(cls, trainer: DictConfig) -> "TrainerSettings":
        fields = {name: trainer[name] for name in cls.__dataclass_fields__ if trainer.get(name) is not None}
        return cls(**fields | {"precision": str(fields.get("precision", "32-true"))})

    def validates(self, epoch: int) -> bool:
        """Whether Lightning validates at the end of epoch `epoch` (from 0)."""
        return (epoch + 1) % self.check_val_every_n_epoch == 0

    def batches(self, stage: str, batches: int) -> int:
        """How many of a loader's `batches` an epoch of `stage` (train, val, test) uses."""
        return parse_batch_limit(getattr(self, f"limit_{stage}_batches"), batches, f"limit_{stage}_batches")

    def steps(self, batch_index: int, batches: int) -> bool:
        """Whether the optimizer steps after batch `batch_index` (from 0) of an epoch of `batches`."""
        return (batch_index + 1) % self.accumulate_grad_batches == 0 or batch_index + 1 == batches

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """What Lightning's MixedPrecision plugin wraps every step in (`forward_context`); nothing in float32."""
        if self.precision != "bf16-mixed":
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)

    def clip(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip the gradients of the optimizer's parameters after backward, before the step, as Lightning's
        precision plugin does (`clip_gradients`: nothing for a value <= 0)."""
        if self.gradient_clip_val is None or self.gradient_clip_val <= 0:
            return
        parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        if self.gradient_clip_algorithm == "value":
            nn.utils.clip_grad_value_(parameters, clip_value=self.gradient_clip_val)
        else:
            nn.utils.clip_grad_norm_(parameters, self.gradient_clip_val)


def build(
    cfg: DictConfig, device: torch.device, shard: Callable[[nn.Module], None] | None = None
) -> tuple[ClassificationDataModule, nn.Module, torch.optim.Optimizer, Schedule | None]:
    """Seed, then data, then network, optimizer and schedule: the order (and so the random numbers) of
    `project.train`. The schedule (None without `model.scheduler`) is sized as Lightning sizes it
    (`project.engine.schedules`). `shard` (FSDP's) changes the network in place before the optimizer takes its
    parameters, which sharding replaces."""
    require_the_classifier(cfg)
    require_what_the_reference_mirrors(cfg)
    give_hints(cfg)
    torch.manual_seed(cfg.seed)
    datamodule: ClassificationDataModule = instantiate_group("data", cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    network = instantiate_group("model", cfg.model.network).to(device)
    if cfg.get("compile"):
        network.compile()  # in place, as project.engine.build compiles the Lightning side's network
    if shard is not None:
        shard(network)
    optimizer = instantiate_group("model", cfg.model.optimizer)(network.parameters())
    schedule = None
    if cfg.model.get("scheduler") is not None:
        epochs = cfg.trainer.max_epochs
        settings = TrainerSettings.from_config(cfg.trainer)
        steps = steps_per_epoch(datamodule, settings) * epochs
        schedule = build_schedule(instantiate_group("model", cfg.model.scheduler), optimizer, steps, epochs)
        if schedule.monitor is not None and settings.check_val_every_n_epoch != 1:
            raise UserError(
                f"model.scheduler follows {schedule.monitor}, which trainer.check_val_every_n_epoch="
                f"{cfg.trainer.check_val_every_n_epoch} leaves unmeasured after some epochs: validate every epoch"
            )
    return datamodule, network, optimizer, schedule


def require_one_device(cfg: DictConfig) -> None:
    """Refuse `trainer.devices` other than 1 where the reference trains in one process on one device (`single`):
    Lightning would start a process per device, and the sides would train different runs."""
    if str(cfg.trainer.devices) != "1":
        raise UserError(
            f"trainer.devices={cfg.trainer.devices} makes Lightning train in several processes, and "
            "project.optional.reference.single trains on one device: set trainer.devices=1, or pick the strategy too "
            "(trainer=ddp trainer.devices=2)"
        )


def world_size() -> int:
    """The processes training together: 1 unless a process group is up (DDP)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank_zeros(metrics: dict[str, float]) -> dict[str, float]:
    """Rank 0's `metrics` on every rank (itself, in one process)."""
    if world_size() == 1:
        return metrics
    shared = [metrics]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def steps_per_epoch(datamodule: ClassificationDataModule, settings: TrainerSettings) -> int:
    """This process's optimizer steps per epoch, counted as Lightning counts them for `estimated_stepping_batches`:
    batches of its `DistributedSampler` share of the training set (all of it in one process), as many as
    `limit_train_batches` keeps, one step per `accumulate_grad_batches` of them (and one for any left over)."""
    samples = math.ceil(len(datamodule.train_set) / world_size())
    batches = samples // datamodule.batch_size if datamodule.drop_last else math.ceil(samples / datamodule.batch_size)
    return math.ceil(settings.batches("train", batches) / settings.accumulate_grad_batches)


@dataclass
class Checkpointing:
    """Where the loop writes its checkpoint, and how often inside an epoch (`callbacks.mid_epoch_checkpoint`'s keys,
    where that optional part is here and switched on)."""

    path: Path
    datamodule: ClassificationDataModule  # states the training order's position
    every_n_steps: int | None = None
    every_n_minutes: float | None = None


class Trainer:
    """Trains `model` (the network, or a DataParallel/DDP wrapper of it) and evaluates it.

    The epoch's loss and accuracy are counted with the Lightning path's metric (`ClassificationTotals`); under
    DDP its `compute()` sums them over all processes, so they cover all of the data on every rank. With
    `checkpointing` set, it writes checkpoints as the module docstring says; with `settings`, it clips, accumulates,
    limits and autocasts as Lightning does. A sharded model (`project.optional.reference.fsdp`) overrides the state-dict
    methods, and has every rank evaluate.
    """

    # Whether every rank runs validation and test (each on the whole set), rather than rank 0 alone.
    every_rank_evaluates = False

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule | None,
        device: torch.device,
        history: TrainingHistory,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.schedule = schedule
        self.device = device
        self.history = history
        self.train_totals = ClassificationTotals().to(device)
        self.epoch_metrics: list[dict[str, float]] = []
        self.checkpointing: Checkpointing | None = None
        self.settings = TrainerSettings()  # Lightning's defaults; `fit_and_report` sets the run's
        # Where training stands: batches of `epoch` done, optimizer steps in all.
        self.epoch, self.batches_done, self.global_step = 0, 0, 0
        self.sigterm = False  # set by the SIGTERM handler; the loop stops after the step it is in
        # How the ranks agree on a SIGTERM and on the clock (checkpointing with more than one rank).
        self.agreement: DeferredAgreement | None = None
        self._last_write = time.monotonic()
        # A NaN or infinite loss or gradient stops the run, read every `check_every` steps (stop_when_diverged).
        self.divergence: DivergenceWatch | None = None
        self.check_every = 1

    def _run_batch(self, inputs: Tensor, labels: Tensor, batch_index: int, steps: bool) -> tuple[Tensor, Tensor]:
        """Forward and backward of batch `batch_index` of the epoch, then the optimizer step if `steps`; its logits
        and its loss as Lightning's history records it (divided by `accumulate_grad_batches`)."""
        with self._gradient_sync(steps):
            with self.settings.autocast(self.device):
                logits = self.model(inputs)
                loss = nn.functional.cross_entropy(logits, labels)
            scaled = loss / self.settings.accumulate_grad_batches  # as Lightning's closure divides it, 1 included
            if batch_index % self.settings.accumulate_grad_batches == 0:
                self.optimizer.zero_grad()
            scaled.backward()
        if steps:
            self._step()
        return logits, loss.detach(), scaled.detach()

    def _gradient_sync(self, steps: bool) -> contextlib.AbstractContextManager:
        """DDP averages the gradients over ranks at the backward of a window's last batch only, as Lightning does;
        `no_sync` must hold the forward pass too, which is where DDP decides whether the backward reduces."""
        if steps or not isinstance(self.model, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def _step(self) -> None:
        if self.divergence is not None:  # after DDP has averaged the gradients: every rank decides alike
            self.divergence.observe_gradients(self.global_step + 1, self.model.parameters())
        self.settings.clip(self.optimizer)
        self.optimizer.step()
        self.global_step += 1
        if self.schedule is not None and self.schedule.interval == "step":
            self.schedule.step({})  # after every optimizer step, as Lightning steps a schedule with interval "step"

    def _run_epoch(self, loader: DataLoader) -> dict[str, float]:
        self.model.train()
        losses = []
        batches = self.settings.batches("train", len(loader))
        for inputs, labels in itertools.islice(loader, batches - self.batches_done):
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            steps = self.settings.steps(self.batches_done, batches)
            logits, loss, recorded = self._run_batch(inputs, labels, self.batches_done, steps)
            losses.append(recorded)
            self.train_totals.update(logits, labels, loss)
            self.batches_done += 1
            if self.divergence is not None:
                self.divergence.observe_step(self.global_step, recorded, (inputs, labels))
                if self.global_step % self.check_every == 0:
                    self._check_divergence()
            # At a window's end only, so a resumed run starts a window afresh; the epoch's end writes anyway.
            if self.checkpointing is not None and steps and self.batches_done < batches:
                self._checkpoint_if_due()
        self._check_divergence()
        if self.schedule is not None and self.schedule.interval == "epoch" and self.schedule.monitor is None:
            self.schedule.step({})  # after the epoch's last step, before validation, as Lightning steps it
        self.history.end_epoch(losses, samples=int(self.train_totals.count))  # this process's samples
        metrics = {f"train/{name}": value.item() for name, value in self.train_totals.compute().items()}
        self.train_totals.reset()
        return metrics

    def fit(self, train_loader: DataLoader, val_loader: DataLoader | None, epochs: int) -> None:
        """Train up to epoch `epochs`, validating after each one when `val_loader` is given (rank 0 only in DDP).

        While it trains, SIGTERM is only noted (the loop checkpoints and stops between steps); the previous handler
        is put back afterwards, which also lets go of this Trainer: a handler left in place would keep it, its DDP
        model and so the process group alive until the interpreter exits.
        """
        start = time.perf_counter()
        previous = signal.signal(signal.SIGTERM, self._note_sigterm) if self.checkpointing is not None else None
        if self.checkpointing is not None and world_size() > 1 and self.agreement is None:
            self.agreement = DeferredAgreement(size=2)  # every rank is here at once
        try:
            for epoch in range(self.epoch, epochs):
                if hasattr(train_loader.sampler, "set_epoch"):
                    train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
                if self.batches_done:  # resumed inside this epoch: on from the next batch of its order
                    train_loader.sampler.start_part_way(epoch, self.batches_done * train_loader.batch_size)
                metrics = self._run_epoch(train_loader)
                if val_loader is not None and self.settings.validates(epoch):
                    metrics |= self.evaluate(val_loader, "val")
                self.epoch_metrics.append(metrics)
                self.epoch, self.batches_done = epoch + 1, 0
                if self.checkpointing is not None:
                    self._save_checkpoint()
                if self.schedule is not None and self.schedule.monitor is not None:
                    # On the validation's metric, after the checkpoint, as Lightning does; under DDP rank 0 alone
                    # validates, and hands its metrics to the other ranks.
                    self.schedule.step(rank_zeros(metrics))
            # A SIGTERM in the last epoch's last windows, which no step asked about: the epoch's checkpoint is written.
            if self.checkpointing is not None and self._sigterm_on_any_rank():
                self._stop_for_sigterm()
        finally:
            if self.checkpointing is not None:
                signal.signal(signal.SIGTERM, previous)
        self.history.fit_seconds = time.perf_counter() - start

    def _check_divergence(self) -> None:
        if self.divergence is not None:
            self.divergence.check(first_learning_rate([self.optimizer]))

    def _note_sigterm(self, signum: int, frame: object) -> None:
        self.sigterm = True  # only noted here: the loop checkpoints and stops between steps

    def _sigterm_on_any_rank(self) -> bool:
        """Whether SIGTERM reached any rank by now (every rank asks at the same point)."""
        if self.agreement is None:
            return self.sigterm
        return self.agreement.now([self.sigterm, False])[0]

    def _checkpoint_if_due(self) -> None:
        """Write the checkpoint every N steps / M minutes, and on SIGTERM write it and stop.

        Under DDP or FSDP the ranks agree on a SIGTERM and on a clock that says it is time, one window after they
        saw it (`project.engine.ddp`: no wait on the device), so all act after one same step."""
        every_n_steps = self.checkpointing.every_n_steps
        by_steps = every_n_steps is not None and self.global_step % every_n_steps == 0
        if self.agreement is None:
            stop, by_time = self.sigterm, self._clock_says_write()
        else:  # a signal on any rank stops them all, and any rank's clock writes for all
            stop, by_time = self.agreement.settle()
        if stop or by_steps or by_time:
            self._save_checkpoint()
        if stop:
            self._stop_for_sigterm()
        if self.agreement is not None:  # each clock read after the write, which resets it
            self.agreement.start([self.sigterm, self._clock_says_write()])

    def _clock_says_write(self) -> bool:
        every_n_minutes = self.checkpointing.every_n_minutes
        return every_n_minutes is not None and time.monotonic() - self._last_write >= 60 * every_n_minutes

    def _stop_for_sigterm(self) -> None:
        """End the run, its checkpoint written (every rank is here)."""
        raise RunStopped(
            f"stopped by SIGTERM in epoch {self.epoch}: resume from its last checkpoint (step {self.global_step}) "
            f"with the same command plus ckpt_path={self.checkpointing.path.resolve()}",
            128 + signal.SIGTERM,
        )

    def _save_checkpoint(self) -> None:
        """Weights, optimizer, schedule and the training order's position: all a resumed run needs to go on exactly.

        Rank 0 writes (the ranks hold the same weights) to a temporary file and renames it: a kill mid-write keeps the
        previous one.
        """
        self._last_write = time.monotonic()
        self._check_divergence()  # no checkpoint of diverged weights
        network, optimizer = self.network_state(), self.optimizer_state()  # on every rank: a sharded model gathers
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return
        position = self.checkpointing.datamodule.position(self.epoch, self.batches_done, world_size())
        state = {
            "network": network,
            "optimizer": optimizer,
            "scheduler": self.schedule.scheduler.state_dict() if self.schedule is not None else None,
            "global_step": self.global_step,
            "position": asdict(position),
        }
        path = self.checkpointing.path
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        torch.save(state, partial)
        os.replace(partial, path)

    def load_checkpoint(self, path: str | Path) -> None:
        """Go on from a checkpoint of `_save_checkpoint`, refused in one line if this run's order differs."""
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
            saved = TrainingPosition(**state["position"])
        except Exception:  # a missing, damaged or foreign file: torch and the dataclass raise many types
            raise UserError(
                f"ckpt_path={path} is not a checkpoint of the reference loop (its runs write checkpoints/last.pt)"
            ) from None
        saved.check_resumable_as(self.checkpointing.datamodule.position(saved.epoch, saved.batches_done, world_size()))
        check_resumable(state["scheduler"] or {}, self.schedule)  # as the Lightning path refuses it
        self.load_states(state["network"], state["optimizer"])
        if self.schedule is not None:
            self.schedule.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.batches_done, self.global_step = saved.epoch, saved.batches_done, state["global_step"]
        self.history.first_epoch, self.history.first_step = saved.epoch, self.global_step

    def network_state(self) -> dict[str, Tensor]:
        """The bare network's `state_dict` (without DDP's `module.`)."""
        return getattr(self.model, "module", self.model).state_dict()

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def load_states(self, network: dict[str, Tensor], optimizer: dict) -> None:
        """Load what `network_state` and `optimizer_state` gave."""
        getattr(self.model, "module", self.model).load_state_dict(network)
        self.optimizer.load_state_dict(optimizer)

    @torch.no_grad()
    def evaluate(self, loader: DataLoader, stage: str) -> dict[str, float]:
        """Mean loss and accuracy of the current weights on `loader`, keyed `<stage>/loss`, `<stage>/acc`."""
        self.model.eval()
        totals = ClassificationTotals(sync_on_compute=False).to(self.device)  # one process sees the whole set
        for inputs, labels in itertools.islice(loader, self.settings.batches(stage, len(loader))):
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            with self.settings.autocast(self.device):
                logits = self.model(inputs)
                loss = nn.functional.cross_entropy(logits, labels)
            totals.update(logits, labels, loss)
        return {f"{stage}/{name}": value.item() for name, value in totals.compute().items()}


def fit_and_report(
    cfg: DictConfig,
    trainer: Trainer,
    datamodule: ClassificationDataModule,
    train_loader: DataLoader,
    is_main: bool = True,
) -> None:
    """Train (on from `ckpt_path`, if given); every process saves its history; the main one alone validates, tests
    (or every one, where `trainer.every_rank_evaluates`) and writes the run's outputs."""
    # As the Lightning side's callbacks.mid_epoch_checkpoint writes it (none where that is off or not in the config).
    every = OmegaConf.select(cfg, "callbacks.mid_epoch_checkpoint")
    every = every if switched_on(every) else {}
    checkpoint = Path(cfg.run_dir) / "checkpoints" / "last.pt"
    trainer.checkpointing = Checkpointing(
        checkpoint, datamodule, every.get("every_n_steps"), every.get("every_n_minutes")
    )
    trainer.settings = TrainerSettings.from_config(cfg.trainer)
    if cfg.get("stop_when_diverged", True):
        trainer.divergence, trainer.check_every = DivergenceWatch(), cfg.trainer.get("log_every_n_steps", 50)
    if cfg.ckpt_path is not None:
        trainer.load_checkpoint(cfg.ckpt_path)
    evaluates = is_main or trainer.every_rank_evaluates
    trainer.fit(train_loader, datamodule.val_dataloader() if evaluates else None, cfg.trainer.max_epochs)
    trainer.history.save(cfg.run_dir)
    weights = trainer.network_state()
    test_metrics = trainer.evaluate(datamodule.test_dataloader(), "test") if evaluates else {}
    if is_main:
        write_outputs(cfg.run_dir, trainer, weights, collect_results(trainer, test_metrics, cfg.run_dir))


def write_outputs(run_dir: str | Path, trainer: Trainer, weights: dict[str, Tensor], results: dict) -> None:
    """What the main process of a reference run leaves in its run dir, in the Lightning path's layout; `weights`:
    the bare network's (no `module.`)."""
    run_dir = Path(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(weights, run_dir / "checkpoints" / "model.pt")
    with SummaryWriter(run_dir / "tensorboard") as writer:
        for step, loss in enumerate(trainer.history.step_losses):
            writer.add_scalar("train/step_loss", loss, step)
        for epoch, metrics in enumerate(trainer.epoch_metrics):
            for name, value in metrics.items():
                writer.add_scalar(name, value, epoch)
        for name in ("test/loss", "test/acc"):
            writer.add_scalar(name, results[name], len(trainer.epoch_metrics))
    save_results(results, run_dir)
    print(format_results_table(results), flush=True)


def collect_results(trainer: Trainer, test_metrics: dict, run_dir: str | Path) -> dict:
    """The same keys as the Lightning path's results.json: each metric as last measured (the validation's, with
    `check_val_every_n_epoch`, maybe some epochs back, as Lightning's `callback_metrics` keep it)."""
    latest = {}
    for metrics in trainer.epoch_metrics:
        latest |= metrics
    return latest | test_metrics | trainer.history.run_summary(run_dir)
