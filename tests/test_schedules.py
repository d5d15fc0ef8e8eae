"""project/engine/schedules.py: any torch schedule from config, its run length filled in, refused in one line where it
cannot be built or stepped as configured (both paths train with these: tests/optional/reference/test_compare.py)."""

import functools
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from project.engine.errors import UserError, error_line
from project.engine.schedules import (
    RUN_EPOCHS,
    RUN_STEPS,
    ScheduleLengthCheck,
    build_schedule,
    check_resumable,
    register_resolvers,
)

lr_scheduler = torch.optim.lr_scheduler


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


def test_the_run_length_is_filled_in_wherever_a_schedule_and_its_parts_ask_for_it():
    chained = functools.partial(
        lr_scheduler.SequentialLR,
        schedulers=[
            functools.partial(lr_scheduler.LinearLR, total_iters=RUN_EPOCHS),
            functools.partial(lr_scheduler.CosineAnnealingLR, T_max=RUN_STEPS),
        ],
        milestones=[3],
        interval="epoch",
    )
    schedule = build_schedule(chained, optimizer(), steps=40, epochs=4)
    warmup, cosine = schedule.scheduler._schedulers
    assert (warmup.total_iters, cosine.T_max) == (4, 40)
    assert schedule.lightning_config() == {"scheduler": schedule.scheduler, "interval": "epoch"}
    assert schedule.scheduler.sized_for == {"epochs": 4, "steps": 40}
    assert schedule.scheduler.state_dict()["sized_for"] == {"epochs": 4, "steps": 40}, "checkpoints carry it"


@pytest.mark.parametrize(
    ("factory", "steps", "epochs", "named"),
    [
        (functools.partial(lr_scheduler.StepLR, step_size=1, interval="batch"), 10, 2, "interval='batch'"),
        (functools.partial(lr_scheduler.ReduceLROnPlateau), 10, 2, "monitor: val/loss"),
        (functools.partial(lr_scheduler.ReduceLROnPlateau, monitor="val/loss"), 10, 2, "interval: epoch"),
        (functools.partial(lr_scheduler.CosineAnnealingLR, T_max=RUN_EPOCHS), 10, -1, "set trainer.max_epochs"),
        (functools.partial(lr_scheduler.CosineAnnealingLR, T_max=RUN_STEPS), float("inf"), -1, "trainer.max_steps"),
        (functools.partial(lr_scheduler.OneCycleLR, max_lr=0.1), 10, 2, "${run_steps:}"),
        (lr_scheduler.StepLR, 10, 2, "_partial_: true"),
        (functools.partial(lr_scheduler.LambdaLR), 10, 2, "missing 1 required positional argument: 'lr_lambda'"),
    ],
)
def test_a_schedule_that_cannot_be_built_or_stepped_as_configured_is_one_line(factory, steps, epochs, named):
    with pytest.raises(UserError, match="model.scheduler") as raised:
        build_schedule(factory, optimizer(), steps, epochs)
    assert named in str(raised.value) and "\n" not in str(raised.value)
    if "lr_lambda" in named:
        assert "${run_steps:}" not in str(raised.value), "the run's length is no help to a missing lr_lambda"


def test_a_checkpoint_of_a_schedule_sized_for_another_run_is_refused():
    factory = functools.partial(lr_scheduler.CosineAnnealingLR, T_max=RUN_STEPS)
    stored = build_schedule(factory, optimizer(), steps=7, epochs=1).scheduler.state_dict()
    check_resumable(stored, build_schedule(factory, optimizer(), steps=7, epochs=1))
    with pytest.raises(UserError, match="spans 7 steps, this run's would span 14 steps"):
        check_resumable(stored, build_schedule(factory, optimizer(), steps=14, epochs=2))


def test_a_checkpoint_whose_schedule_length_is_no_length_is_refused_naming_what_it_holds():
    """A checkpoint is data: `sized_for` may hold anything, which the line shows with its control characters escaped."""
    factory = functools.partial(lr_scheduler.CosineAnnealingLR, T_max=RUN_STEPS)
    stored = build_schedule(factory, optimizer(), steps=7, epochs=1).scheduler.state_dict() | {"sized_for": "7\x1b"}
    with pytest.raises(UserError, match=r"holds sized_for='7\\x1b', no length, and a schedule cannot be stretched"):
        check_resumable(stored, build_schedule(factory, optimizer(), steps=7, epochs=1))


def test_a_schedule_dropped_or_added_on_resume_is_refused_and_not_resuming_checks_nothing():
    cosine = build_schedule(functools.partial(lr_scheduler.CosineAnnealingLR, T_max=RUN_STEPS), optimizer(), 7, 1)
    with pytest.raises(UserError, match="this run has none"):
        check_resumable(cosine.scheduler.state_dict(), None)
    with pytest.raises(UserError, match="had none to go on from"):
        check_resumable({}, cosine)
    stepped = build_schedule(functools.partial(lr_scheduler.StepLR, step_size=1), optimizer(), 7, 1)
    with pytest.raises(UserError, match="spans 7 steps, this run's would span no set length"):
        check_resumable(cosine.scheduler.state_dict(), stepped)
    check_resumable({}, stepped)  # a schedule of no run length may start on a resume
    check_resumable(None, cosine)
    check_resumable({}, None)


def test_a_fraction_of_the_run_is_rounded_and_never_less_than_one_step():
    """`${run_steps:0.05}`: warmup_cosine's warm-up fits a toy run of 6 steps and an MNIST run of 1000 alike."""
    register_resolvers()
    fraction = OmegaConf.create({"warmup": "${run_steps:0.05}"}).warmup
    for steps, warmup_steps in ((6, 1), (1000, 50), (30, 2)):
        factory = functools.partial(lr_scheduler.LinearLR, start_factor=0.01, total_iters=fraction)
        schedule = build_schedule(factory, optimizer(), steps=steps, epochs=3)
        assert schedule.scheduler.total_iters == warmup_steps
        assert schedule.scheduler.sized_for == {"steps": steps}, "a resume checks the run's length, not the part"
    with pytest.raises(Exception) as raised:
        OmegaConf.to_container(OmegaConf.create({"warmup": "${run_steps:2}"}), resolve=True)
    assert error_line(raised.value) == "error: model.scheduler: ${run_steps:2} takes a fraction > 0 and <= 1"


@pytest.mark.parametrize(("stepped", "refused"), [(12, False), (13, True)])
def test_a_fixed_length_schedule_as_long_as_the_run_trains_and_one_step_short_is_refused(stepped, refused):
    """OneCycleLR of 12 steps: a run of 12 optimizer steps steps it exactly to its end; torch fails at a 13th."""
    schedule = lr_scheduler.OneCycleLR(optimizer(), max_lr=0.1, total_steps=12)
    config = SimpleNamespace(scheduler=schedule, interval="step", frequency=1)
    trainer = SimpleNamespace(lr_scheduler_configs=[config], estimated_stepping_batches=stepped, ckpt_path=None)
    if not refused:
        ScheduleLengthCheck().on_train_start(trainer, None)
        return
    with pytest.raises(UserError, match="OneCycleLR ends after 12 steps, and this run steps it 13 times"):
        ScheduleLengthCheck().on_train_start(trainer, None)


@pytest.mark.parametrize(("fraction", "taken"), [(1, True), (0.5, True), (0, False), (-0.5, False)])
def test_a_fraction_of_the_run_is_over_zero_and_at_most_the_whole_run(fraction, taken):
    register_resolvers()
    node = OmegaConf.create({"warmup": f"${{run_steps:{fraction}}}"})
    if taken:
        assert OmegaConf.to_container(node, resolve=True) == {"warmup": f"{RUN_STEPS}*{fraction}"}
        return
    with pytest.raises(Exception) as raised:
        OmegaConf.to_container(node, resolve=True)
    expected = f"error: model.scheduler: ${{run_steps:{fraction}}} takes a fraction > 0 and <= 1"
    assert error_line(raised.value) == expected


def read_from_a_file(text: str) -> str:
    """`text` as a config file gives it: a string of its own, not the interpreter's shared constant."""
    return "".join(list(text))


def test_a_plateau_schedule_given_its_metric_and_interval_epoch_builds():
    factory = functools.partial(
        lr_scheduler.ReduceLROnPlateau, monitor="val/loss", interval=read_from_a_file("epoch"), patience=2
    )
    schedule = build_schedule(factory, optimizer(), steps=10, epochs=2)
    assert isinstance(schedule.scheduler, lr_scheduler.ReduceLROnPlateau)
    assert schedule.lightning_config() == {"scheduler": schedule.scheduler, "interval": "epoch", "monitor": "val/loss"}


def test_the_reference_loop_steps_a_schedule_on_its_metric_where_it_follows_one():
    plateau = build_schedule(
        functools.partial(lr_scheduler.ReduceLROnPlateau, monitor="val/loss", interval="epoch", patience=0),
        optimizer(),
        steps=10,
        epochs=2,
    )
    for loss in (1.0, 1.0):  # no better: the rate falls by its factor (0.1) after the second
        plateau.step({"val/loss": loss})
    assert plateau.scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    halving = build_schedule(
        functools.partial(lr_scheduler.StepLR, step_size=1, gamma=0.5), optimizer(), steps=10, epochs=2
    )
    halving.scheduler.optimizer.step()  # as the loop does, before the schedule
    halving.step({})
    assert halving.scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


@pytest.mark.parametrize(("epochs", "taken"), [(1, True), (0, False), (-1, False)])
def test_a_schedule_sized_by_the_run_needs_a_run_of_at_least_one_epoch(epochs, taken):
    factory = functools.partial(lr_scheduler.CosineAnnealingLR, T_max=RUN_EPOCHS)
    if taken:
        assert build_schedule(factory, optimizer(), steps=10, epochs=epochs).scheduler.T_max == 1
        return
    with pytest.raises(UserError, match="needs a run of a set length"):
        build_schedule(factory, optimizer(), steps=10, epochs=epochs)


@pytest.mark.parametrize(
    ("interval", "frequency", "total_steps", "max_epochs", "steps", "refusal"),
    [
        ("epoch", 2, 3, 7, 70, None),  # stepped after epochs 2, 4 and 6
        ("epoch", 2, 3, 8, 80, "this run steps it 4 times"),
        ("epoch", 1, 3, -1, 70, "this run steps it without end"),
        ("epoch", 1, 3, 1, 10, None),
        ("step", 2, 5, 1, 10, None),
        ("step", 2, 5, 1, 12, "this run steps it 6 times"),
        ("step", 1, 100, 1, 10, None),  # a schedule longer than the run ends early, as it is meant to
    ],
)
def test_a_fixed_length_schedule_is_checked_against_the_times_the_run_steps_it_every_few_epochs_or_steps(
    interval, frequency, total_steps, max_epochs, steps, refusal
):
    schedule = lr_scheduler.OneCycleLR(optimizer(), max_lr=0.1, total_steps=total_steps)
    config = SimpleNamespace(scheduler=schedule, interval=read_from_a_file(interval), frequency=frequency)
    trainer = SimpleNamespace(
        lr_scheduler_configs=[config], max_epochs=max_epochs, estimated_stepping_batches=steps, ckpt_path=None
    )
    if refusal is None:
        ScheduleLengthCheck().on_train_start(trainer, None)
        return
    with pytest.raises(UserError, match=f"OneCycleLR ends after {total_steps} steps, and {refusal}"):
        ScheduleLengthCheck().on_train_start(trainer, None)


def test_every_fixed_length_schedule_of_a_module_is_checked_not_only_the_first():
    fits = lr_scheduler.OneCycleLR(optimizer(), max_lr=0.1, total_steps=10)
    short = lr_scheduler.OneCycleLR(optimizer(), max_lr=0.1, total_steps=5)
    configs = [SimpleNamespace(scheduler=s, interval="step", frequency=1) for s in (fits, short)]
    trainer = SimpleNamespace(lr_scheduler_configs=configs, max_epochs=1, estimated_stepping_batches=10, ckpt_path=None)
    with pytest.raises(UserError, match="OneCycleLR ends after 5 steps, and this run steps it 10 times"):
        ScheduleLengthCheck().on_train_start(trainer, None)
