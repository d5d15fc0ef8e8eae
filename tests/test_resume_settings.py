"""A setting changed on resume is applied, and recorded as the value used, or refused in one line before the first
step (docs/checkpoints.md, "Changing a setting on resume"): never recorded one way and trained another. Lightning
restores the optimizers' param groups as the checkpoint holds them; `RestoredStateCheck` puts back what this run
configures where no schedule drives it, and refuses a changed lr under a schedule, or a changed schedule."""

import functools
import re
from pathlib import Path

import lightning as L
import pytest
import torch

from project.engine.checkpoints import RestoredStateCheck, changed_schedule, stored_configured
from project.engine.errors import UserError
from tests.faults import ENV
from tests.foreign_modules import RegressionData, RegressionModule
from tests.helpers import check_ok, read_json, run_module


class ScheduledRegression(RegressionModule):
    """The regression with SGD at `lr` and `weight_decay`, stepped down by `gamma` each epoch where `gamma` is set."""

    def __init__(self, lr: float = 0.05, weight_decay: float = 0.0, gamma: float | None = None) -> None:
        super().__init__(lr=lr)
        self.weight_decay, self.gamma = weight_decay, gamma

    def configure_optimizers(self) -> torch.optim.Optimizer | dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self.gamma is None:
            return optimizer
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=self.gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "epoch"}}


def fit(
    module: L.LightningModule, epochs: int, ckpt_path: Path | None = None, run_dir: Path | None = None
) -> L.Trainer:
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=[RestoredStateCheck(str(ckpt_path) if ckpt_path else None)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=run_dir,
    )
    trainer.fit(module, datamodule=RegressionData(), ckpt_path=ckpt_path)
    return trainer


@functools.cache
def one_epoch(tmp: Path, **settings: float) -> Path:
    path = tmp / f"one-epoch-{'-'.join(f'{k}{v}' for k, v in settings.items())}.ckpt"
    fit(ScheduledRegression(**settings), 1).save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resume-settings")


def test_a_hyperparameter_no_schedule_drives_is_the_one_this_run_configures(tmp: Path, capsys):
    """Weight decay changed under a StepLR: applied after the restore, said once; the lr stays the schedule's."""
    checkpoint = one_epoch(tmp, gamma=0.5)
    group = fit(ScheduledRegression(weight_decay=0.01, gamma=0.5), 2, checkpoint).optimizers[0].param_groups[0]
    assert group["weight_decay"] == 0.01
    assert group["lr"] == pytest.approx(0.05 * 0.5**2), "two epochs of the schedule, from the checkpoint's one"
    said = re.findall(r"resumed with .*", capsys.readouterr().err)
    assert said == ["resumed with weight_decay 0.01 for param group 0 (the checkpoint trained at 0.0), as this run "
                    "configures"]  # fmt: skip


class DecayRaisedByItsOwnCode(ScheduledRegression):
    """Weight decay its own code raises after each epoch (as DINO's weight-decay schedule does), with no schedule."""

    def on_train_epoch_end(self) -> None:
        for group in self.trainer.optimizers[0].param_groups:
            group["weight_decay"] += 0.01


def test_a_hyperparameter_the_modules_own_code_moved_resumes_as_it_stood(tmp_path: Path, capsys):
    """What the run configured is compared with what the checkpoint's run configured (stored by the callback), not
    with the value its training moved to: the same settings are no change to apply, and training goes on from there."""
    checkpoint = tmp_path / "one-epoch.ckpt"
    fit(DecayRaisedByItsOwnCode(weight_decay=0.01), 1).save_checkpoint(checkpoint)
    group = fit(DecayRaisedByItsOwnCode(weight_decay=0.01), 2, checkpoint).optimizers[0].param_groups[0]
    assert group["weight_decay"] == pytest.approx(0.03), "raised after epochs 1 and 2"
    assert "resumed with" not in capsys.readouterr().err


class Dampened(ScheduledRegression):
    """SGD with momentum, its `dampening` set: a key that sorts before `initial_lr`, the one said as `lr`."""

    def __init__(self, dampening: float) -> None:
        super().__init__()
        self.dampening = dampening

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, dampening=self.dampening)


def test_a_changed_setting_is_said_by_its_own_name(tmp_path: Path, capsys):
    checkpoint = tmp_path / "one-epoch.ckpt"
    fit(Dampened(0.0), 1).save_checkpoint(checkpoint)
    fit(Dampened(0.5), 2, checkpoint)
    said = re.findall(r"resumed with .*", capsys.readouterr().err)
    assert said == [
        "resumed with dampening 0.5 for param group 0 (the checkpoint trained at 0.0), as this run configures"
    ]


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"lr": 0.01, "gamma": 0.5}, "this run configures lr 0.01 for param group 0, the checkpoint's run 0.05, and "
         "its learning-rate schedule (StepLR) drives lr from there"),
        ({"gamma": 0.9}, "the checkpoint's learning-rate schedule 0 (StepLR) was built with gamma=0.5, this run's "
         "with gamma=0.9"),
        ({}, "the checkpoint's run had 1 learning-rate schedule(s), this run has 0"),
    ],
    ids=["lr-under-a-schedule", "schedule-argument", "schedule-dropped"],
)  # fmt: skip
def test_a_changed_lr_under_a_schedule_or_a_changed_schedule_is_refused_before_a_step(tmp: Path, settings, line):
    checkpoint = one_epoch(tmp, gamma=0.5)
    module = ScheduledRegression(**settings)
    with pytest.raises(UserError, match=re.escape(line)):
        fit(module, 2, checkpoint)
    stored = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert all(torch.equal(value, stored[key]) for key, value in module.state_dict().items()), "no step taken"


def test_a_requeued_slurm_job_resuming_from_lightnings_own_checkpoint_is_checked_as_any_resume(
    tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A Slurm job requeued after its `hpc_ckpt_*.ckpt`, newer than its last.ckpt, runs without a ckpt_path
    (`checkpoints.resume_path`): Lightning resumes from that file by itself, and it is checked all the same."""
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(one_epoch(tmp, gamma=0.5).read_bytes())
    slurm = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "localhost"}
    for name, value in {**slurm, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}.items():
        monkeypatch.setenv(name, value)
    line = "the checkpoint's learning-rate schedule 0 (StepLR) was built with gamma=0.5, this run's with gamma=0.9"
    with pytest.raises(UserError, match=re.escape(line)):
        fit(ScheduledRegression(gamma=0.9), 2, run_dir=tmp_path)


def test_a_changed_schedule_is_named_by_its_own_argument_before_what_it_derives_from_it():
    """A schedule's state holds its arguments and what it derives from them (`_`-named, as OneCycleLR's
    `_schedule_phases`): the line names the argument the user changed."""
    stored = [{"total_steps": 10, "_schedule_phases": [{"end_step": 2.0}]}]
    built = [("OneCycleLR", {"total_steps": 20, "_schedule_phases": [{"end_step": 5.0}]})]
    assert changed_schedule(stored, built) == (
        "the checkpoint's learning-rate schedule 0 (OneCycleLR) was built with total_steps=10, this run's with "
        "total_steps=20"
    )
    stored, built = [{"T_0": 10, "eta_min": 0.0}], [("CosineAnnealingWarmRestarts", {"T_0": 20, "eta_min": 0.1})]
    assert "was built with T_0=10, this run's with T_0=20" in changed_schedule(stored, built), "by name, not case"


def test_what_the_checkpoints_run_configured_is_compared_only_where_it_has_this_runs_optimizers_and_groups():
    """The callback's stored state is data: another count of optimizers or of groups is none to compare with."""
    now = [[{"lr": 0.1}, {"lr": 0.2}]]
    assert stored_configured({"configured": now}, now) == now
    for configured in ([], [now[0], now[0]], [now[0][:1]], [now[0] * 2]):
        assert stored_configured({"configured": configured}, now) is None, configured


@pytest.mark.slow
def test_a_resume_with_another_lr_trains_at_it_and_records_it(tmp_path: Path):
    """`project.train ckpt_path=<last> model.optimizer.lr=0.05` of the toy run at 0.5: the optimizer steps at 0.05
    (its state in the checkpoint the resumed run writes, its logged lr), which the stored config records."""
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    check_ok(run_module("project.train", "trainer.max_epochs=1", "logger=none", f"hydra.run.dir={first}",
                        cwd=tmp_path, env=ENV))  # fmt: skip
    result = check_ok(
        run_module(
            "project.train",
            f"ckpt_path={first}/checkpoints/last.ckpt",
            "trainer.max_epochs=2",
            "model.optimizer.lr=0.05",
            "logger=none",
            f"hydra.run.dir={resumed}",
            cwd=tmp_path,
            env=ENV,
        )
    )
    assert "resumed with lr 0.05 for param group 0 (the checkpoint trained at 0.5)" in result.stderr
    written = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert written["optimizer_states"][0]["param_groups"][0]["lr"] == 0.05
    assert written["config"]["model"]["optimizer"]["lr"] == 0.05
    assert read_json(resumed / "results.json")["train/lr"] == pytest.approx(0.05), "the lr its steps took"
