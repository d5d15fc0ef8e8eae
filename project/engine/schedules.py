"""Learning-rate schedules from config (`model.scheduler`: any `torch.optim.lr_scheduler` class), sized to the run by
`${run_steps:}` and `${run_epochs:}`, and refused in one line where they cannot be built or cannot last the run."""

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import lightning as L
import torch

from project.engine.errors import UserError, quoted
from project.engine.upstream import register_resolver

RUN_STEPS = "<the run's optimizer steps>"
RUN_EPOCHS = "<the run's epochs>"
PLACEHOLDERS = {RUN_STEPS: "${run_steps:}", RUN_EPOCHS: "${run_epochs:}"}
UNITS = {RUN_STEPS: "steps", RUN_EPOCHS: "epochs"}
NEEDS = {RUN_STEPS: "set trainer.max_epochs or trainer.max_steps", RUN_EPOCHS: "set trainer.max_epochs"}
INTERVALS = ("step", "epoch")


def register_resolvers() -> None:
    """`${run_steps:}` and `${run_epochs:}`, or a fraction of the run: `${run_steps:0.05}`."""
    for name, placeholder in (("run_steps", RUN_STEPS), ("run_epochs", RUN_EPOCHS)):
        register_resolver(name, functools.partial(part_of_the_run, placeholder), replace=True)


def part_of_the_run(placeholder: str, fraction: float | None = None) -> str:
    """What `${run_steps:<fraction>}` stands for until the run's length is known: `<placeholder>*<fraction>`."""
    if fraction is None:
        return placeholder
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise UserError(f"model.scheduler: {PLACEHOLDERS[placeholder][:-1]}{fraction}}} takes a fraction > 0 and <= 1")
    return f"{placeholder}*{fraction}"


def filled_in(value: str, lengths: dict[str, int | float]) -> tuple[str, int] | None:
    """(placeholder, length) for a `part_of_the_run` string, else None; refused where the run has no set length."""
    placeholder, _, fraction = value.partition("*")
    if placeholder not in lengths:
        return None
    length = lengths[placeholder]
    if not (isinstance(length, int) and length > 0):
        needs = NEEDS[placeholder]
        raise UserError(f"model.scheduler: {PLACEHOLDERS[placeholder]} needs a run of a set length: {needs}")
    return placeholder, max(1, round(length * float(fraction))) if fraction else length


@dataclass
class Schedule:
    """A built schedule and how it is stepped (Lightning's `interval` and `monitor`)."""

    scheduler: torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau
    interval: str
    monitor: str | None

    def lightning_config(self) -> dict:
        """The `lr_scheduler` dict `configure_optimizers` returns."""
        config = {"scheduler": self.scheduler, "interval": self.interval}
        return config | ({"monitor": self.monitor} if self.monitor is not None else {})

    def step(self, metrics: dict[str, float]) -> None:
        """One step (the reference loop's), on the monitored metric where the schedule follows one."""
        if self.monitor is None:
            self.scheduler.step()
        else:
            self.scheduler.step(metrics[self.monitor])


def build_schedule(factory: functools.partial, optimizer: torch.optim.Optimizer, steps: int, epochs: int) -> Schedule:
    """`factory` built on `optimizer`, `${run_steps:}` and `${run_epochs:}` in it filled in; refused in one line
    where it cannot be built or stepped as configured."""
    if not isinstance(factory, functools.partial):
        raise UserError(
            "model.scheduler: give the schedule's class with _partial_: true (it is built on the optimizer)"
        )
    keywords = dict(factory.keywords)
    interval, monitor = keywords.pop("interval", "step"), keywords.pop("monitor", None)
    if interval not in INTERVALS:
        raise UserError(f"model.scheduler.interval={interval!r}: step it every {' or '.join(INTERVALS)}")
    lengths, used = {RUN_STEPS: steps, RUN_EPOCHS: epochs}, {}

    def built(value: object) -> object:
        if isinstance(value, functools.partial):  # a part of a schedule of schedules
            return value.func(*value.args, optimizer=optimizer, **{k: built(v) for k, v in value.keywords.items()})
        if isinstance(value, Sequence) and not isinstance(value, str):  # a list, or Hydra's ListConfig of parts
            return [built(item) for item in value]
        run_part = filled_in(value, lengths) if isinstance(value, str) else None
        if run_part is None:
            return value
        placeholder, length = run_part
        used[placeholder] = lengths[placeholder]
        return length

    try:
        scheduler = factory.func(*factory.args, optimizer=optimizer, **{k: built(v) for k, v in keywords.items()})
    except (TypeError, ValueError, KeyError) as error:  # torch's schedules check their arguments
        # Where the complaint is about a length, say how the YAML gives the run's.
        about_length = re.search(r"step|epoch|iter|T_max|total", str(error), flags=re.IGNORECASE)
        hint = " (the run's length is ${run_steps:} optimizer steps, or ${run_epochs:} epochs)" if about_length else ""
        raise UserError(f"model.scheduler: {factory.func.__name__}: {error}{hint}") from None
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) and (monitor is None or interval != "epoch"):
        raise UserError(
            "model.scheduler: ReduceLROnPlateau follows a metric measured by validation: add the metric and the "
            "interval to model.scheduler, e.g. monitor: val/loss and interval: epoch"
        )
    # A schedule's state is its attributes: this one goes into checkpoints with it, for a resumed run to compare.
    scheduler.sized_for = {UNITS[name]: length for name, length in used.items()}
    return Schedule(scheduler, interval, monitor)


def check_resumable(stored: dict | None, schedule: Schedule | None) -> None:
    """Refuse, in one line, to resume with a schedule that does not go on from the checkpoint's (`stored`: its schedule
    state, {} where its run had none; None when not resuming): one sized for another run, dropped, or added."""
    if stored is None:
        return
    size = schedule.scheduler.sized_for if schedule is not None else None
    if stored and schedule is None:
        problem = "the checkpoint's run had a learning-rate schedule, this run has none (model.scheduler)"
    elif not stored and size:
        problem = "this run's learning-rate schedule spans the whole run, the checkpoint's run had none to go on from"
    elif stored and not isinstance(stored.get("sized_for"), (dict, type(None))):  # a checkpoint is data
        problem = f"the checkpoint's learning-rate schedule holds sized_for={quoted(stored['sized_for'])}, no length"
    elif stored and stored.get("sized_for") is not None and stored["sized_for"] != size:
        lengths = (stored["sized_for"], size or {})
        stored_run, this_run = (" and ".join(f"{n} {u}" for u, n in run.items()) or "no set length" for run in lengths)
        problem = f"the checkpoint's learning-rate schedule spans {stored_run}, this run's would span {this_run}"
    else:
        return
    raise UserError(
        f"ckpt_path: {problem}, and a schedule cannot be stretched, added or dropped mid-run; resume with the "
        "checkpoint's own schedule, trainer.max_epochs, data.batch_size and device count, or start a new run without "
        "ckpt_path"
    )


class ScheduleLengthCheck(L.Callback):
    """Refuses a run longer than a fixed-length schedule of its module, naming both lengths; asked as training starts,
    once Lightning has restored the checkpoint (whose stored length wins)."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for config in trainer.lr_scheduler_configs:
            length = getattr(config.scheduler, "total_steps", None)
            if config.interval == "epoch":  # max_epochs=-1: without end
                needed = trainer.max_epochs // config.frequency if trainer.max_epochs > 0 else math.inf
            else:
                needed = trainer.estimated_stepping_batches // config.frequency
            if not isinstance(length, int) or needed <= length:
                continue
            resumed = " (the checkpoint's length: it was sized for a shorter run)" if trainer.ckpt_path else ""
            times = f"{needed} times" if math.isfinite(needed) else "without end"
            raise UserError(
                f"the learning-rate schedule {type(config.scheduler).__name__} ends after {length} steps{resumed}, "
                f"and this run steps it {times}: resume with the trainer.max_epochs it was sized for, or size "
                "it from the run's length (trainer.estimated_stepping_batches) and start a new run"
            )
