"""Modules whose training leaves parameters out of a loss (tests/gan_module.py) under DDP: without
`trainer.strategy.find_unused_parameters=true` one line names that key, exit 2; with it they train."""

import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.multiprocessing.spawn import ProcessRaisedException

from project.engine.errors import error_line
from project.engine.upstream import VERSION_BASE
from tests.faults import USER_ERROR, assert_ends_in_error_line
from tests.helpers import CONF_DIR, REPO, check_ok, read_json, run_module, train_own

KEY = "trainer.strategy.find_unused_parameters"
GAN = ["model=gan", "data=regression", "optimized_metric=val/d_loss", "optimized_mode=min"]
UNUSED_HEAD = ["model=unused_head", "data=regression", "optimized_metric=val/mse", "optimized_mode=min"]
DDP = ["trainer=ddp", "trainer.devices=2"]
DDP_SPAWN = ["trainer=ddp_spawn"]
# Both ranks meet the same parameters left out, at the same step: each may say the one line before rank 0's end stops
# the other (as a diverged DDP run does), so the line is one, said once or twice.
ONE_LINE = "one line, whichever rank said it"


# DDP's reducer's words: through Lightning's DDP strategy, through torch's alone, and from a ddp_spawn worker.
LIGHTNING_WORDS = "It looks like your LightningModule has parameters that were not used in producing the loss returned"
TORCH_WORDS = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that "
    "your module has parameters that were not used in producing loss."
)
GRAPH_CHANGED_WORDS = "... second iteration. this is not compatible with static_graph set to True."


@pytest.mark.parametrize(
    "error",
    [RuntimeError(LIGHTNING_WORDS), RuntimeError(TORCH_WORDS), ProcessRaisedException(LIGHTNING_WORDS, 0, 1234)],
    ids=["lightning", "torch", "ddp_spawn-worker"],
)
def test_ddps_unused_parameter_errors_in_every_wording_are_one_line_naming_the_key(error: Exception):
    line = error_line(error)
    assert line.startswith("error: DDP found parameters that were not used in producing the loss"), line
    assert line.endswith(f"set {KEY}=true"), line


def test_a_static_graph_that_changes_is_one_line_saying_to_turn_it_off():
    assert "set trainer.strategy.static_graph=false" in error_line(RuntimeError(GRAPH_CHANGED_WORDS))


@pytest.mark.parametrize("trainer", ["ddp", "ddp_spawn", "slurm"])
def test_the_ddp_configs_pass_distributed_data_parallels_switches_without_a_plus(tmp_path: Path, trainer: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        switches = [f"{KEY}=true", "trainer.strategy.static_graph=true"]
        cfg = compose("train", overrides=[f"trainer={trainer}", *switches, f"run_dir={tmp_path}"])
    strategy = instantiate(cfg.trainer.strategy)
    assert strategy._ddp_kwargs == {"find_unused_parameters": True, "static_graph": True}


def launches(spawned: pytest.MarkDecorator | tuple = ()) -> pytest.MarkDecorator:
    """The three ways to meet parameters a loss leaves out; `spawned`: the marks of the ddp_spawn one."""
    return pytest.mark.parametrize(
        ("module", "launch"),
        [
            pytest.param(GAN, DDP, id="gan-manual-optimisation-ddp"),
            pytest.param(GAN, DDP_SPAWN, id="gan-manual-optimisation-ddp_spawn", marks=spawned),
            pytest.param(UNUSED_HEAD, DDP, id="unused-head-automatic-ddp"),
        ],
    )


def run_name(module: list[str], launch: list[str]) -> str:
    return "-".join(arg.split("=")[1] for arg in module[:1] + launch[:1])


# Fresh interpreters for ddp_spawn's refusal: spawned workers forked from the tests' preloaded Python leave
# multiprocessing's resource tracker a warning to print after the error line, which a user's run does not.
@pytest.mark.slow
@launches(spawned=pytest.mark.fresh)
def test_parameters_a_loss_leaves_out_end_the_run_in_one_line_naming_the_key(
    user_dir: Path, module: list[str], launch: list[str]
):
    name = run_name(module, launch)
    run = [*module, *launch, "logger=none", "trainer.max_epochs=2", f"hydra.run.dir=outputs/{name}-refused"]
    refused = train_own(user_dir, *run)
    line = assert_ends_in_error_line(
        refused.returncode,
        refused.stdout,
        refused.stderr,
        USER_ERROR,
        "not used in producing the loss",
        f"{KEY}=true",
        only_line=False,
    )
    assert {text for text in refused.stderr.splitlines() if text.startswith("error:")} == {line}, ONE_LINE
    assert not (user_dir / "outputs" / f"{name}-refused" / "results.json").exists()


@pytest.mark.slow
@launches()
def test_parameters_a_loss_leaves_out_train_with_the_key_the_error_line_names(
    user_dir: Path, module: list[str], launch: list[str]
):
    name = run_name(module, launch)
    run = [*module, *launch, "logger=none", "trainer.max_epochs=2", f"{KEY}=true", f"hydra.run.dir=outputs/{name}"]
    check_ok(train_own(user_dir, *run))
    results = read_json(user_dir / "outputs" / name / "results.json")
    metric = module[2].split("=")[1].replace("val/", "test/")
    assert results["epochs"] == 2 and math.isfinite(results[metric]), results


@pytest.mark.slow
def test_a_static_graph_under_a_gan_is_refused_in_one_line_saying_to_turn_it_off(user_dir: Path):
    """The GAN's two steps use different parameters: DDP's static graph cannot hold them."""
    run = [f"hydra.searchpath=[file://{user_dir / 'my_conf'}]", *GAN, *DDP, "logger=none", "trainer.max_epochs=2"]
    refused = run_module(
        "project.train",
        *run,
        "trainer.strategy.static_graph=true",
        "hydra.run.dir=outputs/static-graph",
        cwd=user_dir,
        env={"PYTHONPATH": str(REPO)},
    )
    line = assert_ends_in_error_line(
        refused.returncode,
        refused.stdout,
        refused.stderr,
        USER_ERROR,
        "set trainer.strategy.static_graph=false",
        only_line=False,
    )
    assert {text for text in refused.stderr.splitlines() if text.startswith("error:")} == {line}, ONE_LINE
