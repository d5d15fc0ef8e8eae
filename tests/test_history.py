"""What a run's history records for any module: the loss its training_step returned and the size of any batch, and
the speed it reports when a batch's size cannot be read (project/engine/history.py)."""

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from project.engine import history
from project.engine.history import (
    Diverged,
    DivergenceGuard,
    DivergenceWatch,
    HistoryCallback,
    TrainingHistory,
    batch_size_of,
    history_carried_on,
    summarise_history,
    training_loss,
)


@dataclasses.dataclass
class Pair:
    inputs: torch.Tensor
    target: torch.Tensor


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (torch.zeros(4, 3), 4),
        ((torch.zeros(4, 3), torch.zeros(4)), 4),
        ({"inputs": torch.zeros(5, 2), "target": torch.zeros(5), "name": "not a tensor"}, 5),
        (Pair(torch.zeros(6, 2), torch.zeros(6)), 6),
        ([{"x": torch.zeros(2, 1)}, (torch.zeros(2),)], 2),
        ((torch.tensor(1.0), torch.zeros(3)), 3),  # a 0-d tensor has no samples to count
    ],
    ids=["tensor", "tuple", "dict", "dataclass", "nested", "scalar-beside"],
)
def test_the_batch_size_is_the_first_dimension_every_tensor_shares(batch: object, size: int):
    assert batch_size_of(batch) == size


@pytest.mark.parametrize(
    "batch",
    [(torch.zeros(4, 3), torch.zeros(5)), "text", torch.tensor(1.0), Pair],
    ids=["disagreeing", "string", "scalar", "a-class-not-an-instance"],
)
def test_a_batch_whose_size_cannot_be_read_has_none(batch: object):
    assert batch_size_of(batch) is None


def test_the_training_loss_is_a_returned_tensor_or_a_dicts_loss():
    loss = torch.tensor(0.5)
    assert training_loss(loss) is loss
    assert training_loss({"loss": loss, "logits": torch.zeros(2)}) is loss
    assert training_loss({"logits": torch.zeros(2)}) is None
    assert training_loss(None) is None  # a step that skipped the batch


def test_an_epochs_loss_is_its_steps_mean_and_the_speed_every_ranks_samples_a_second_or_none_if_unknown(tmp_path: Path):
    history = TrainingHistory(world_size=2, fit_seconds=4.0)
    history.end_epoch([torch.tensor(1.0), torch.tensor(4.0)], samples=5)
    assert history.epoch_losses == [2.5], "an epoch's loss is its steps' mean"
    assert history.run_summary(tmp_path)["samples_per_second"] == 2.5  # 5 samples on each of 2 ranks, in 4 s
    history.end_epoch([], samples=None)
    summary = history.run_summary(tmp_path)
    assert summary["samples_per_second"] is None and summary["epochs"] == 2
    assert math.isnan(history.epoch_losses[-1])  # an epoch without a loss to average


def test_a_run_without_a_history_file_reports_its_size_but_no_speed(tmp_path: Path):
    """callbacks=none records no history: the results table still gets the run's epochs (the trainer's count), world
    size and place, and says it has no time or speed rather than make them up."""
    summary = summarise_history(str(tmp_path), world_size=2, epochs=3)
    assert summary["world_size"] == 2 and summary["epochs"] == 3 and summary["run_dir"] == str(tmp_path)
    assert math.isnan(summary["fit_seconds"]) and summary["samples_per_second"] is None


def test_a_saved_history_loads_back_equal(tmp_path: Path):
    history = TrainingHistory(rank=1, world_size=2, first_epoch=3, first_step=12, fit_seconds=1.5)
    history.end_epoch([torch.tensor(0.25)], samples=4)
    assert TrainingHistory.load(history.save(tmp_path)) == history
    assert (tmp_path / "history.rank1.json").is_file()


def trainer_at(epoch: int, step: int, world_size: int = 1) -> SimpleNamespace:
    """What `history_carried_on` reads of Lightning's trainer: rank 0's restored epoch and step."""
    return SimpleNamespace(global_rank=0, world_size=world_size, current_epoch=epoch, global_step=step)


def test_a_run_resumed_in_its_own_dir_at_its_historys_end_keeps_its_earlier_steps_and_no_other_does(tmp_path: Path):
    """One epoch of 2 steps, then training again in that dir: from epoch 1, step 2 it carries the history on; from
    another epoch, with another number of processes, or from a step before or after the history's end, it starts a
    new one there."""
    earlier = TrainingHistory(fit_seconds=1.5)
    earlier.end_epoch([torch.tensor(0.5), torch.tensor(0.25)], samples=4)
    earlier.save(tmp_path)
    assert history_carried_on(str(tmp_path), trainer_at(1, 2)) == dataclasses.replace(earlier, resumed_at_steps=[2])
    for elsewhere in (
        trainer_at(0, 2),
        trainer_at(2, 2),
        trainer_at(1, 2, world_size=2),
        trainer_at(1, 1),
        trainer_at(1, 3),
    ):
        carried = history_carried_on(str(tmp_path), elsewhere)
        assert (carried.first_epoch, carried.first_step, carried.step_losses) == (
            elsewhere.current_epoch,
            elsewhere.global_step,
            [],
        )


def test_a_start_from_step_0_or_with_fewer_processes_than_the_dirs_history_starts_a_new_one(tmp_path: Path):
    """A history of no steps (a start that ended before its first) is not carried on by a start from step 0, and
    one of 2 processes not by a start of 1."""
    TrainingHistory(fit_seconds=1.5).save(tmp_path)
    assert history_carried_on(str(tmp_path), trainer_at(0, 0)) == TrainingHistory()
    two = TrainingHistory(world_size=2, fit_seconds=1.5)
    two.end_epoch([torch.tensor(0.5), torch.tensor(0.25)], samples=4)
    two.save(tmp_path)
    assert history_carried_on(str(tmp_path), trainer_at(1, 2)) == TrainingHistory(first_epoch=1, first_step=2)


def test_a_history_the_run_cannot_read_is_not_carried_on_and_a_new_one_starts(tmp_path: Path, monkeypatch):
    """Another user's history in a shared outputs dir (mode 600), or one removed as it is read: not this run's."""
    earlier = TrainingHistory(fit_seconds=1.5)
    earlier.end_epoch([torch.tensor(0.5), torch.tensor(0.25)], samples=4)
    earlier.save(tmp_path)

    def unreadable(path: Path) -> TrainingHistory:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(TrainingHistory, "load", unreadable)
    assert history_carried_on(str(tmp_path), trainer_at(1, 2)) == TrainingHistory(first_epoch=1, first_step=2)


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"rank": 0}'])
def test_a_history_file_this_engine_did_not_write_whole_starts_a_new_one(tmp_path: Path, content: str):
    """Not JSON, or JSON of another shape (a list; a mapping that lacks the history's keys): not this run's."""
    (tmp_path / "history.rank0.json").write_text(content)
    assert history_carried_on(str(tmp_path), trainer_at(1, 2)) == TrainingHistory(first_epoch=1, first_step=2)


def test_a_history_resumed_again_in_its_own_dir_carries_on_from_where_its_last_start_ended(tmp_path: Path):
    """A run started from another run's checkpoint (its history begins at step 2, epoch 1), resumed in its own dir
    twice: each start carries the history on, and it lists both steps resumed at."""
    first = TrainingHistory(first_epoch=1, first_step=2)
    first.end_epoch([torch.tensor(0.5), torch.tensor(0.25)], samples=4)
    first.save(tmp_path)
    second = history_carried_on(str(tmp_path), trainer_at(2, 4))
    assert second == dataclasses.replace(first, resumed_at_steps=[4])
    second.end_epoch([torch.tensor(0.125), torch.tensor(0.0625)], samples=4)
    second.save(tmp_path)
    third = history_carried_on(str(tmp_path), trainer_at(3, 6))
    assert (third.first_step, third.step_losses, third.resumed_at_steps) == (2, [0.5, 0.25, 0.125, 0.0625], [4, 6])


def test_the_history_is_written_into_its_run_dir_made_where_missing(tmp_path: Path):
    """`callbacks.history.run_dir` may name a dir of its own, or the callback serve a Trainer of the user's own:
    the dir and its parents are made at fit's end."""
    callback = HistoryCallback(str(tmp_path / "elsewhere" / "run"))
    callback.on_train_start(trainer_at(0, 0), None)
    callback.on_fit_end(trainer_at(1, 2), None)
    assert TrainingHistory.load(tmp_path / "elsewhere" / "run" / "history.rank0.json").first_step == 0


def test_a_starts_training_time_is_added_to_the_history_it_carries_on(tmp_path: Path, monkeypatch):
    """`fit_seconds` (the speed's denominator) runs from training's start to fit's end, and a run resumed in its own
    dir adds its start's time to the earlier starts'."""
    earlier = TrainingHistory(fit_seconds=1.5)
    earlier.end_epoch([torch.tensor(0.5), torch.tensor(0.25)], samples=4)
    earlier.save(tmp_path)
    clock = iter([100.0, 250.0])
    monkeypatch.setattr(history.time, "perf_counter", lambda: next(clock))
    callback = HistoryCallback(str(tmp_path))
    callback.on_train_start(trainer_at(1, 2), None)
    callback.on_fit_end(trainer_at(2, 4), None)
    assert TrainingHistory.load(tmp_path / "history.rank0.json").fit_seconds == 151.5


def test_a_long_history_is_carried_on_from_its_end(tmp_path: Path):
    """Past step and epoch 256 (where Python's ints stop being shared objects) a history ends where it ends."""
    earlier = TrainingHistory(first_epoch=299, first_step=1000)
    earlier.end_epoch([torch.tensor(0.5), torch.tensor(0.25)], samples=4)
    earlier.save(tmp_path)
    carried = history_carried_on(str(tmp_path), trainer_at(int("300"), int("1002")))
    assert carried.resumed_at_steps == [1002]


def test_an_epochs_samples_are_its_batches_sizes_summed_and_unknown_from_a_batch_of_no_size_on():
    """Batches of 3 and 2 samples make an epoch of 5; in the next, one batch of no readable size makes the epoch's
    count unknown, whatever the batches after it; each epoch counts afresh."""
    callback = HistoryCallback(run_dir="unused")
    for batches in ([torch.zeros(3, 2), torch.zeros(2, 2)], [torch.zeros(3, 2), "text", torch.zeros(2, 2)], []):
        callback.on_train_epoch_start(None, None)
        for index, batch in enumerate(batches):
            callback.on_train_batch_end(None, None, torch.tensor(1.0), batch, index)
        callback.on_train_epoch_end(None, None)
    assert callback.history.epoch_samples == [5, None, 0]
    assert callback.history.step_losses == [1.0] * 5


def trainer_logging_every(steps: int) -> SimpleNamespace:
    """What `DivergenceGuard` reads of Lightning's trainer: the step, the logging interval, an optimizer's rate."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    return SimpleNamespace(global_step=0, log_every_n_steps=steps, optimizers=[optimizer], precision_plugin=None)


def steps_taken(guard: DivergenceGuard, trainer: SimpleNamespace, losses: list[float], inputs: list[float]) -> None:
    """Optimizer steps 1, 2, ... with these losses, each on a batch of one input of the value given."""
    for loss, value in zip(losses, inputs, strict=True):
        trainer.global_step += 1
        batch = (torch.tensor([[value]]), torch.tensor([0]))
        guard.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, batch, trainer.global_step - 1)


def test_a_divergence_between_two_checks_names_its_first_bad_step_and_that_steps_inputs():
    """Checked every 4th step: after a check at step 4, step 6's loss is inf on finite inputs, step 7's NaN on NaN
    inputs, step 8's finite. The line at step 8 names step 6, its loss, and the learning rate, not step 7's data."""
    guard, trainer = DivergenceGuard(), trainer_logging_every(4)
    steps_taken(guard, trainer, losses=[0.5, 0.5, 0.5, 0.5, 0.5, math.inf], inputs=[1.0] * 6)
    steps_taken(guard, trainer, losses=[math.nan], inputs=[math.nan])
    with pytest.raises(Diverged) as raised:
        steps_taken(guard, trainer, losses=[0.3], inputs=[1.0])
    assert str(raised.value).startswith(
        "training diverged at step 6 (loss inf): lower the learning rate (now 0.1), or clip the gradients"
    )


def test_a_divergence_on_a_checks_own_step_stops_the_run_at_that_step():
    """Checked every 4th step: step 4's loss is NaN, and the check that ends step 4 stops the run there, not steps
    later (the steps checked are the multiples of the interval: 4, 8, 12, ...)."""
    guard, trainer = DivergenceGuard(), trainer_logging_every(4)
    steps_taken(guard, trainer, losses=[0.5, 0.5, 0.5], inputs=[1.0] * 3)
    with pytest.raises(Diverged, match="^training diverged at step 4 "):
        steps_taken(guard, trainer, losses=[math.nan], inputs=[1.0])


def test_a_trainer_that_never_logs_is_checked_every_step():
    """`log_every_n_steps=0` (Lightning's own for `barebones=True`, which logs nothing) leaves no interval to check
    at: the guard checks every step rather than dividing by it (a ZeroDivisionError at the first step)."""
    guard, trainer = DivergenceGuard(), trainer_logging_every(0)
    steps_taken(guard, trainer, losses=[0.5, 0.5], inputs=[1.0] * 2)
    with pytest.raises(Diverged, match="^training diverged at step 3 "):
        steps_taken(guard, trainer, losses=[math.nan], inputs=[1.0])


def test_a_checkpoint_written_between_two_checks_after_a_bad_step_is_refused_so_the_last_finite_one_stays():
    """Checked every 50th step: at step 3 a checkpoint's write asks first, and the run stops before it stores NaN."""
    guard, trainer = DivergenceGuard(), trainer_logging_every(50)
    steps_taken(guard, trainer, losses=[0.5, 0.4, math.nan], inputs=[1.0, 1.0, 1.0])
    with pytest.raises(Diverged, match="training diverged at step 3 "):
        guard.on_save_checkpoint(trainer, None, {})


def test_of_two_ranks_one_that_saw_only_finite_steps_stops_with_the_other_at_its_first_bad_step(monkeypatch):
    """Rank 1 diverged at step 5; rank 0, all finite, raises the same line at the same check (one all-gather)."""
    monkeypatch.setattr(history.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(history.dist, "get_world_size", lambda: 2)

    def all_gather_object(everyone: list, mine: tuple) -> None:
        everyone[:] = [mine, (5, math.inf, False)]

    monkeypatch.setattr(history.dist, "all_gather_object", all_gather_object)
    watch = DivergenceWatch()
    watch.observe_step(1, torch.tensor(0.5), (torch.ones(1, 1),))
    with pytest.raises(
        Diverged, match=r"^training diverged at step 5 \(loss inf\): lower the learning rate \(now 0.1\)"
    ):
        watch.check(0.1)


def test_ranks_agree_on_the_first_bad_step_and_the_mean_loss_and_inputs_of_the_ranks_that_stopped_there(monkeypatch):
    """Of four ranks, one all finite, one bad from step 7 (on bad inputs), two from step 5 with finite losses (their
    gradients were not): the run stops at step 5, with those two ranks' mean loss, blaming no inputs."""
    monkeypatch.setattr(history.dist, "get_world_size", lambda: 4)

    gathered = [(7, 0.5, True), (5, 1.0, False), (5, 2.0, False)]

    def all_gather_object(everyone: list, mine: tuple) -> None:
        everyone[:] = [mine, *gathered]

    monkeypatch.setattr(history.dist, "all_gather_object", all_gather_object)
    assert history.agreed(-1, 0.0, False) == (5, 1.5, False)
    gathered = [(0, 3.0, True), (-1, 0.0, False), (-1, 0.0, False)]  # bad before its first optimizer step
    assert history.agreed(-1, 0.0, False) == (0, 3.0, True)
    gathered = [(int("300"), 1.0, False), (int("300"), 3.0, False), (-1, 0.0, False)]  # each rank's own int
    assert history.agreed(-1, 0.0, False) == (300, 2.0, False)


def test_a_check_before_any_loss_was_seen_passes():
    """A checkpoint written before the first step, or an epoch whose every step returned no loss (a module that
    skips its batches) and left no gradients: nothing seen, nothing to stop."""
    guard, trainer = DivergenceGuard(), trainer_logging_every(1)
    guard.on_save_checkpoint(trainer, None, {})
    trainer.global_step += 1
    guard.on_train_batch_end(trainer, None, None, (torch.ones(1, 1),), 0)
    guard.on_train_epoch_end(trainer, None)


def test_a_module_without_an_optimizer_that_diverges_is_stopped_without_naming_a_rate():
    """`configure_optimizers` may return none (Lightning trains nothing then, and the module may step itself)."""
    guard, trainer = DivergenceGuard(), trainer_logging_every(1)
    trainer.optimizers = []
    with pytest.raises(Diverged, match=r"^training diverged at step 1 \(loss nan\): lower the learning rate, or clip"):
        steps_taken(guard, trainer, losses=[math.nan], inputs=[1.0])


def test_the_divergence_line_names_the_rate_of_the_first_optimizers_first_group():
    """A GAN's two optimizers, the first with two parameter groups: the line names the rate of the first's first."""
    guard, trainer = DivergenceGuard(), trainer_logging_every(1)
    first = torch.optim.SGD(
        [{"params": [torch.nn.Parameter(torch.zeros(1))]}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.5}],
        lr=0.25,
    )
    trainer.optimizers = [first, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.75)]
    with pytest.raises(
        Diverged, match=r"^training diverged at step 1 \(loss nan\): lower the learning rate \(now 0.25\)"
    ):
        steps_taken(guard, trainer, losses=[math.nan], inputs=[1.0])


def test_a_bad_loss_before_the_first_optimizer_step_stops_the_run():
    """Accumulating gradients, the first batches end before any optimizer step (Lightning's step still 0): a NaN
    loss there stops the run at the next check like any other."""
    watch = DivergenceWatch()
    watch.observe_step(0, torch.tensor(math.nan), (torch.ones(1, 1),))
    watch.observe_step(1, torch.tensor(math.nan), (torch.ones(1, 1),))
    with pytest.raises(Diverged, match=r"^training diverged at step 0 \(loss nan\)"):
        watch.check(0.1)
