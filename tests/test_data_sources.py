"""A stage runs where its dataloader is, the data module's or the module's own (`data=none`), and is refused in one
line where there is none (project/engine/build.py); the zoo (tests/test_zoo.py) runs such modules end to end.
"""

from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
from lightning.pytorch.demos.transformer import LightningTransformer
from torch.utils.data import DataLoader, RandomSampler

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
from project.engine.build import ServedByTheEngine, build, check_data_for, why_no_test
from project.engine.checkpoints import TrainingOrder, orderable, refuse_a_resume_the_data_cannot_continue
from project.engine.errors import UserError, error_line
from project.engine.upstream import VERSION_BASE
from tests.foreign_modules import DictBatchData, DictBatchModule
from tests.helpers import CONF_DIR


@pytest.mark.parametrize("stage", ["train", "test", "predict"])
def test_a_module_with_dataloaders_of_its_own_needs_no_data_module(stage: str):
    check_data_for(stage, BoringModel(), None, "project.x")
    check_data_for(stage, BoringModel(), BoringDataModule(), "project.x")


def refusal(stage: str, module, datamodule) -> str:
    with pytest.raises(UserError) as raised:
        check_data_for(stage, module, datamodule, f"project.{stage}")
    return error_line(raised.value)


def test_a_stage_without_its_step_or_dataloader_is_one_line_naming_what_to_define():
    """LightningTransformer serves only training batches and defines no test_step; DictBatchData no predict batches."""
    transformer = LightningTransformer(vocab_size=8)
    assert refusal("test", transformer, None) == (
        "error: project.test runs the module's test_step, which LightningTransformer does not define: define "
        "test_step in it"
    )
    assert refusal("predict", transformer, None) == (
        "error: project.predict needs a predict_dataloader, and LightningTransformer defines none while data=none "
        "gives it no data module: define predict_dataloader in LightningTransformer, or choose a data module "
        "(data=<option>)"
    )
    assert refusal("predict", DictBatchModule(), DictBatchData()) == (
        "error: project.predict needs a predict_dataloader, which neither DictBatchModule nor DictBatchData defines: "
        "define predict_dataloader in one of them"
    )


def test_data_none_builds_no_data_module_and_refuses_a_module_without_batches_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The example's classifier takes its batches from a data module: with none, the run stops before it starts."""
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # build seeds; later tests in this process must not inherit it
        monkeypatch.setenv(name, "0")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=["data=none", f"run_dir={tmp_path}"])
    assert dict(cfg.data) == {}
    with pytest.raises(UserError) as raised:
        build(cfg, tmp_path / "outputs")
    assert error_line(raised.value) == (
        "error: project.train needs a train_dataloader, and ClassifierModule defines none while data=none gives it no "
        "data module: define train_dataloader in ClassifierModule, or choose a data module (data=<option>)"
    )


def test_a_resume_inside_an_epoch_of_batches_the_engine_cannot_order_is_refused():
    """A loader with a sampler of its own keeps no place in its epoch (the module's state is its weights), and the
    engine cannot put its seeded order there: the epoch would restart its batches."""
    trainer = SimpleNamespace(
        ckpt_path="last.ckpt",
        num_training_batches=64,
        accumulate_grad_batches=1,
        global_step=3,
        datamodule=None,
        lightning_module=BoringModel(),
    )
    with pytest.raises(UserError) as raised:
        refuse_a_resume_the_data_cannot_continue(trainer, ordered_by_the_engine=False)
    assert error_line(raised.value) == (
        "error: ckpt_path=last.ckpt was written inside an epoch (step 3), and BoringModel's training loader has a "
        "sampler of its own (or an iterable dataset), which keeps no place in an epoch, so the epoch would restart "
        "its batches: resume from a checkpoint written at an epoch's end, or serve the training batches with torch's "
        "own samplers (DataLoader(..., shuffle=True or False)), whose order the engine keeps, or from a data module "
        "with state_dict and load_state_dict that restore where its epoch stood (see the classifier's "
        "project/example/data/classification.py)"
    )
    refuse_a_resume_the_data_cannot_continue(trainer, ordered_by_the_engine=True)  # the engine keeps its place
    trainer.global_step = 64
    refuse_a_resume_the_data_cannot_continue(trainer, ordered_by_the_engine=False)  # an epoch's end: nothing to do


@pytest.mark.parametrize(("step", "refused"), [(3, False), (6, False), (4, True), (5, True)])
def test_a_resume_where_gradients_accumulate_is_inside_an_epoch_only_between_its_optimizer_steps(step, refused):
    """5 batches accumulated 2 by 2 are 3 optimizer steps per epoch (the last of one batch): a data module without
    `state_dict` whose order the engine cannot keep resumes at steps 3 and 6, an epoch's end, and is refused at 4
    and 5."""
    trainer = SimpleNamespace(
        ckpt_path="last.ckpt",
        num_training_batches=5,
        accumulate_grad_batches=2,
        global_step=step,
        datamodule=BoringDataModule(),
        lightning_module=BoringModel(),
    )
    if not refused:
        refuse_a_resume_the_data_cannot_continue(trainer, ordered_by_the_engine=False)
        return
    with pytest.raises(UserError, match=f"was written inside an epoch \\(step {step}\\), and BoringDataModule's"):
        refuse_a_resume_the_data_cannot_continue(trainer, ordered_by_the_engine=False)


def test_train_tests_nothing_where_no_test_step_or_no_test_dataloader_serves_it_and_says_why():
    """Training needs neither; project.train then skips its test with a line saying why, instead of a test over no
    batches."""

    class TrainOnly(BoringModel):
        test_dataloader = L.LightningModule.test_dataloader

    class NoTestStep(BoringModel):
        test_step = L.LightningModule.test_step

    assert why_no_test(BoringModel(), None) is None
    assert why_no_test(TrainOnly(), None) == "neither TrainOnly defines a test_dataloader"
    assert why_no_test(NoTestStep(), BoringDataModule()) == "NoTestStep defines no test_step"


def test_training_loaders_the_engine_cannot_order_are_served_as_the_data_gives_them():
    """A list or dict of loaders (Lightning combines them), or a loader with a sampler of its own, has no order the
    engine keeps: it is handed on untouched, its sample count unknown, not a traceback."""
    order, data = TrainingOrder(seed=0), BoringDataModule()
    data.setup("fit")
    for loaders in ({"a": data.train_dataloader()}, [data.train_dataloader()]):
        assert order.training_loader(data, loaders) is loaders
        assert order.sampler is None and order.data == {"train_samples": None, "classes": None}


def test_a_random_sampler_that_draws_a_part_of_the_data_or_more_than_it_keeps_its_own_order():
    """`RandomSampler(num_samples=8)` draws 8 of 64 samples an epoch, and `num_samples=128` each of them twice: a
    seeded order of all 64 once in its place would train others, or fewer, than the data module asks for."""
    data = BoringDataModule()
    data.setup("fit")
    part = DataLoader(data.random_train, batch_size=2, sampler=RandomSampler(data.random_train, num_samples=8))
    twice = DataLoader(data.random_train, batch_size=2, sampler=RandomSampler(data.random_train, num_samples=128))
    whole = DataLoader(data.random_train, batch_size=2, shuffle=True)
    assert not orderable(part) and not orderable(twice) and orderable(whole)


def test_a_module_without_a_test_step_trains_all_the_same():
    """LightningTransformer defines no test_step: training it is no test, and nothing asks for one."""
    module = LightningTransformer(vocab_size=8)
    check_data_for("train", module, None, "project.train")  # no refusal
    assert why_no_test(module, None) == "LightningTransformer defines no test_step"  # said, not refused


class FewSamples(L.LightningDataModule):
    """Five samples to validate and to test, plain loaders: the engine shares them out among the processes."""

    def val_dataloader(self) -> DataLoader:
        return DataLoader(range(5), batch_size=2)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(range(5), batch_size=2)


@pytest.mark.parametrize(("stage", "named"), [("val", "validation"), ("test", "test")])
def test_a_set_smaller_than_the_processes_is_refused_naming_the_set(stage: str, named: str):
    data = FewSamples()
    data.trainer = SimpleNamespace(world_size=6, global_rank=0, strategy=None)
    with pytest.raises(UserError) as raised:
        ServedByTheEngine(data, stage, TrainingOrder(seed=0))()
    assert str(raised.value).startswith(f"the {named} set has 5 samples, fewer than the 6 processes")
