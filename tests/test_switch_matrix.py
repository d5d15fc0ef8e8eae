"""Switches that combine: every pair of config choices either builds a run or refuses in one `error:` line.

(a) The switch axes below, composed pairwise (every value pair of every two axes in at least one combination, from
a small greedy all-pairs generator), each built by `project.engine.build.build` without training: fast.
(b) The pairs where two features act only at run time (a strategy with a sweep, a resume, a precision or a config
source; a schedule with a resume) trained as tiny runs, checking what they leave behind: slow.
"""

import itertools
import math
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.types import RunMode
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from omegaconf import DictConfig, OmegaConf, open_dict

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
from project.engine.build import build
from project.engine.config import run_config_of
from project.engine.errors import find_user_error
from project.engine.history import HistoryCallback
from project.engine.upstream import VERSION_BASE
from project.example.data import MNISTDataModule, ToyDataModule
from project.example.networks import DeepNeuralNetwork, NeuralNetwork
from tests.foreign_modules import FOREIGN_CONF, RegressionData, RegressionModule
from tests.helpers import (
    CONF_DIR,
    REPO,
    SRUN_TASK_ZERO,
    TRUST_TEST_CODE,
    check_ok,
    histories,
    mnist_overrides,
    part_present,
    read_json,
    requires,
    run_module,
)


def present(*values: tuple[str, str]) -> tuple[str, ...]:
    """The values (each with the optional part it needs, or None) whose part is here: a deleted part's switches go."""
    return tuple(value for value, part in values if part is None or part_present(part))


AXES: dict[str, tuple[str, ...]] = {
    # "default": no trainer= override, so the recipe's choice (trainer/default, or slurm for mnist_slurm).
    "trainer": present(
        ("default", None),
        ("cpu", None),
        ("gpu", None),
        ("dp", "dp"),
        ("ddp", None),
        ("ddp_spawn", None),
        ("slurm", "slurm"),
    ),
    "recipe": present(
        ("experiment=toy", None),
        ("experiment=mnist", None),
        ("experiment=mnist_slurm", "slurm"),
        ("data=mnist model=mnist_mlp", None),
        ("data=fashion_mnist model=mnist_mlp", None),
        ("data=kmnist model=mnist_mlp", None),
        ("foreign", None),  # a LightningModule and data module of the user's own: FOREIGN_RECIPE
    ),
    "logger": ("tensorboard", "csv", "none"),
    "callbacks": ("default", "none"),
    "precision": ("32-true", "bf16-mixed", "bf16-true", "16-mixed"),
    "launch": present(("plain", None), ("multirun", None), ("optuna", "optuna"), ("submitit", "slurm")),
    "resume": ("none", "file", "last"),
    "source": ("default", "config-dir", "config-name"),
}
Combination = dict[str, str]


def all_pairs(axes: dict[str, tuple[str, ...]]) -> list[Combination]:
    """A deterministic greedy covering array of strength 2: every value pair of every two axes occurs somewhere.

    Each new combination starts from the first pair still uncovered and fills the other axes, in order, with the
    value that covers the most uncovered pairs with what is already chosen (the first such value on a tie).
    """
    names = list(axes)

    def pair(first: tuple[str, str], second: tuple[str, str]) -> tuple:
        """(axis, value) twice, in axis order: the one spelling of a pair."""
        return tuple(sorted([first, second], key=lambda item: names.index(item[0])))

    uncovered = {((a, x), (b, y)) for a, b in itertools.combinations(names, 2) for x in axes[a] for y in axes[b]}
    combinations = []
    while uncovered:
        (a, x), (b, y) = min(uncovered, key=lambda p: (names.index(p[0][0]), names.index(p[1][0]), p))
        chosen = {a: x, b: y}
        for name in names:
            if name not in chosen:
                newly_covered = {
                    v: sum(pair((o, chosen[o]), (name, v)) in uncovered for o in chosen) for v in axes[name]
                }
                chosen[name] = max(axes[name], key=newly_covered.__getitem__)
        ordered = {name: chosen[name] for name in names}
        uncovered -= {((p, ordered[p]), (q, ordered[q])) for p, q in itertools.combinations(names, 2)}
        combinations.append(ordered)
    return combinations


COMBINATIONS = all_pairs(AXES)


def label(combination: Combination) -> str:
    return " ".join(f"{axis}={value}" for axis, value in combination.items())


# --- (a) every pair builds or refuses ---------------------------------------------------------------------------

NO_GPU = not torch.cuda.is_available()
# Combinations that must refuse on this machine, with a fragment of their one-line message; all others must build.
# The first that applies is the one expected (the config checks run before anything is built).
EXPECTED_REFUSALS: list[tuple[Callable[[Combination], bool], str]] = [
    # float16 autocast needs a CUDA GPU; Lightning would quietly train in bf16-mixed instead.
    (lambda c: NO_GPU and c["precision"] == "16-mixed", "is float16 autocast, which needs a CUDA GPU"),
    # The search reports each trial's best checkpoint (results_from=best), which callbacks=none does not save.
    (lambda c: c["launch"] == "optuna" and c["callbacks"] == "none", "results_from=best needs the best checkpoint"),
    (lambda c: NO_GPU and c["trainer"] == "gpu", "No supported gpu backend found"),
]
OTHER_NAME = "my_train"  # the -cn copy of train.yaml
# tests/foreign_modules.py's regression, from its YAML files on Hydra's search path, optimising the metric it logs.
FOREIGN_RECIPE = [
    f"hydra.searchpath=[file://{FOREIGN_CONF}]",
    "model=regression",
    "data=regression",
    "optimized_metric=val/mse",
    "optimized_mode=min",
]
LAUNCH_OVERRIDES = {
    "plain": [],
    "multirun": ["hydra.mode=MULTIRUN", "seed=7"],  # one job of `-m seed=1,7`
    # One trial: the sweeper adds its suggested values to the job's overrides.
    "optuna": ["hydra.mode=MULTIRUN", "hparams_search=mnist_optuna", "model.optimizer.lr=0.0005", "data.batch_size=64"],
    "submitit": ["hydra/launcher=slurm", "hydra.mode=MULTIRUN"],
}


@pytest.fixture(autouse=True)
def unchanged_environment() -> Iterator[None]:
    """Building seeds (PL_GLOBAL_SEED) and may set launcher variables; later tests must not inherit them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def config_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Config source → (config dir, config name): conf/ itself, a copy of it (-cd), train.yaml renamed (-cn)."""
    copy = tmp_path_factory.mktemp("user") / "conf"
    shutil.copytree(CONF_DIR, copy)
    shutil.copy(copy / "train.yaml", copy / f"{OTHER_NAME}.yaml")
    return {"default": (CONF_DIR, "train"), "config-dir": (copy, "train"), "config-name": (copy, OTHER_NAME)}


@contextmanager
def composed_train(config_dir: Path, name: str, overrides: list[str]) -> Iterator[tuple[DictConfig, DictConfig]]:
    """The job's config as `hydra.main` hands it over, and the `hydra` node beside it, while Hydra holds the config
    dir as its source, as it does for a run's whole job (a resumed checkpoint's stored config is checked against
    the targets the config files name)."""
    with initialize_config_dir(str(config_dir), **VERSION_BASE):
        cfg = compose(name, overrides=overrides, return_hydra_config=True)
        with open_dict(cfg):
            hydra_cfg = cfg.pop("hydra")
        yield cfg, hydra_cfg


def is_mnist_family(recipe: str) -> bool:
    return "mnist" in recipe


def family(recipe: str) -> str:
    """Which earlier run a combination resumes from: one per kind of model and data."""
    return "foreign" if recipe == "foreign" else "mnist" if is_mnist_family(recipe) else "toy"


def recipe_overrides(recipe: str) -> list[str]:
    return FOREIGN_RECIPE if recipe == "foreign" else recipe.split()


@pytest.fixture(scope="module")
def earlier_runs(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> dict[str, tuple[Path, Path]]:
    """Per `family`: (a checkpoint file, an outputs dir whose one run has a last.ckpt).

    Real checkpoints of one epoch, trained in this process on the toy points, the small MNIST files and the
    foreign regression's points.
    """
    runs = {}
    families = (("toy", ["logger=none"]), ("mnist", mnist_overrides(mnist_root)), ("foreign", FOREIGN_RECIPE))
    for kind, overrides in families:
        outputs = tmp_path_factory.mktemp("outputs")
        run_dir = outputs / "earlier"
        overrides = [*overrides, "trainer=cpu", "trainer.max_epochs=1", f"run_dir={run_dir}"]
        with composed_train(CONF_DIR, "train", overrides) as (cfg, _):
            run = build(cfg, outputs)
        run.trainer.fit(run.module, datamodule=run.datamodule)
        saved = outputs.parent / f"{outputs.name}.ckpt"
        shutil.copy(run_dir / "checkpoints" / "last.ckpt", saved)
        runs[kind] = (saved, outputs)
    return runs


def combination_overrides(combination: Combination, resume_file: Path, run_dir: Path) -> list[str]:
    trainer = [] if combination["trainer"] == "default" else [f"trainer={combination['trainer']}"]
    resume = {"none": [], "file": [f"ckpt_path={resume_file}"], "last": ["ckpt_path=last"]}[combination["resume"]]
    launch = LAUNCH_OVERRIDES[combination["launch"]]
    if combination["recipe"] == "foreign" and combination["launch"] == "optuna":
        launch = [o.replace("model.optimizer.lr", "model.lr") for o in launch]  # the regression's own argument
    return [
        *recipe_overrides(combination["recipe"]),
        *trainer,
        f"logger={combination['logger']}",
        f"callbacks={combination['callbacks']}",
        f"trainer.precision={combination['precision']}",
        *launch,
        *resume,
        f"run_dir={run_dir}",
    ]


def expected_refusal(combination: Combination) -> str | None:
    return next((fragment for applies, fragment in EXPECTED_REFUSALS if applies(combination)), None)


@pytest.mark.parametrize("combination", COMBINATIONS, ids=label)
def test_every_pair_of_switches_builds_or_refuses_in_one_line(
    combination: Combination,
    tmp_path: Path,
    config_dirs: dict[str, tuple[Path, str]],
    earlier_runs: dict[str, tuple[Path, Path]],
):
    """Built: the Trainer, data and network are the ones chosen. Refused: a user error, which ends in one line."""
    resume_file, outputs = earlier_runs[family(combination["recipe"])]
    run_dir = tmp_path / "run"
    config_dir, config_name = config_dirs[combination["source"]]
    refusal = expected_refusal(combination)
    try:
        with composed_train(config_dir, config_name, combination_overrides(combination, resume_file, run_dir)) as (
            cfg,
            hydra_cfg,
        ):
            if cfg.trainer.num_nodes > 1:
                os.environ.update(SRUN_TASK_ZERO)  # put back by the `unchanged_environment` fixture
            run = build(cfg, outputs)
    except Exception as error:
        user_error = find_user_error(error)
        if user_error is None:
            raise AssertionError(f"{label(combination)}: crashed instead of refusing in one line") from error
        assert refusal is not None, f"{label(combination)}: refused unexpectedly: {user_error}"
        assert refusal in str(user_error), f"{label(combination)}: refused for another reason: {user_error}"
        return
    assert refusal is None, f"{label(combination)}: built, but should refuse ({refusal!r})"
    check_sources_and_launch(combination, hydra_cfg, config_dir, config_name)
    check_data_and_network(combination, run)
    check_trainer(combination, run.trainer, run_dir)
    latest = outputs / "earlier" / "checkpoints" / "last.ckpt"
    expected_ckpt = {"none": None, "file": str(resume_file), "last": str(latest)}[combination["resume"]]
    assert run.ckpt_path == expected_ckpt
    assert run_config_of(run.trainer)["trainer"]["precision"] == combination["precision"], "checkpoints store it"


def check_sources_and_launch(combination: Combination, hydra_cfg: DictConfig, config_dir: Path, name: str) -> None:
    assert hydra_cfg.job.config_name == name
    main_source = next(source for source in hydra_cfg.runtime.config_sources if source.provider == "main")
    assert main_source.path == str(config_dir)
    assert hydra_cfg.mode == (None if combination["launch"] == "plain" else RunMode.MULTIRUN)
    sweeper = "ResumableOptunaSweeper" if combination["launch"] == "optuna" else "BasicSweeper"
    assert hydra_cfg.sweeper._target_.endswith(sweeper)
    launcher = "SlurmLauncher" if combination["launch"] == "submitit" else "BasicLauncher"
    assert hydra_cfg.launcher._target_.endswith(launcher)


def check_data_and_network(combination: Combination, run) -> None:
    recipe, launch = combination["recipe"], combination["launch"]
    if recipe == "foreign":
        assert isinstance(run.datamodule, RegressionData) and isinstance(run.module, RegressionModule)
        if launch == "optuna":
            assert run.datamodule.batch_size == 64 and run.module.lr == 0.0005
    elif is_mnist_family(recipe):
        assert isinstance(run.datamodule, MNISTDataModule)
        assert run.datamodule.name == (recipe.split()[0].split("=")[1] if recipe.startswith("data=") else "mnist")
        assert isinstance(run.module.network, DeepNeuralNetwork)
    else:
        assert isinstance(run.datamodule, ToyDataModule) and isinstance(run.module.network, NeuralNetwork)
    if launch == "optuna" and recipe != "foreign":
        assert run.datamodule.batch_size == 64 and run.module.optimizer_factory.keywords["lr"] == 0.0005
    assert run_config_of(run.trainer)["seed"] == (7 if launch == "multirun" else 123)


STRATEGIES = {  # trainer config → (strategy class name, processes per node, nodes)
    "default": ("SingleDeviceStrategy", 1, 1),
    "cpu": ("SingleDeviceStrategy", 1, 1),
    "gpu": ("SingleDeviceStrategy", 1, 1),
    "dp": ("DataParallelStrategy", 1, 1),
    "ddp": ("HydraDDPStrategy", 2, 1),
    "ddp_spawn": ("DDPStrategy", 2, 1),
    "slurm": ("HydraDDPStrategy", 1, 2),
}


def check_trainer(combination: Combination, trainer: L.Trainer, run_dir: Path) -> None:
    name = combination["trainer"]
    if name == "default" and combination["recipe"] == "experiment=mnist_slurm":
        name = "slurm"
    strategy, processes, nodes = STRATEGIES[name]
    assert type(trainer.strategy).__name__ == strategy, f"{name}: {type(trainer.strategy).__name__}"
    assert (trainer.num_devices, trainer.num_nodes, trainer.world_size) == (processes, nodes, processes * nodes)
    if name == "ddp_spawn":
        assert trainer.strategy._start_method == "spawn"
    precision = combination["precision"]
    assert trainer.precision == precision
    logger = {"tensorboard": [TensorBoardLogger], "csv": [CSVLogger], "none": []}[combination["logger"]]
    assert [type(logger) for logger in trainer.loggers] == logger
    assert all(Path(logger.save_dir) == run_dir for logger in trainer.loggers)
    checkpoints = str(run_dir / "checkpoints")
    ours = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath == checkpoints]
    history = [c for c in trainer.callbacks if isinstance(c, HistoryCallback)]
    if combination["callbacks"] == "default":
        assert sorted(str(c.filename) for c in ours) == ["best-epoch{epoch:03d}", "last"] and len(history) == 1
    else:
        assert ours == [] and history == []


# --- (b) pairs that act at run time, trained -------------------------------------------------------------------

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
WITH_TEST_CALLBACKS = {**ONE_THREAD, "PYTHONPATH": str(REPO)}  # lets a run import tests.crash_callback
TRAIN_IMAGES = 350  # mnist_overrides: 400 small MNIST files, 50 held out


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(path for path in sweep_dir.iterdir() if path.is_dir() and not path.name.startswith("."))


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def assert_finite_run(run_dir: Path, world_size: int, epoch_samples: list[int], steps: int) -> None:
    """Every rank trained its share (samples per epoch, steps) with finite losses; results name the world size."""
    ranks = histories(run_dir)
    assert [(h["rank"], h["world_size"]) for h in ranks] == [(rank, world_size) for rank in range(world_size)]
    for history in ranks:
        assert history["epoch_samples"] == epoch_samples and len(history["step_losses"]) == steps
        assert all(math.isfinite(loss) for loss in history["step_losses"])
    results = read_json(run_dir / "results.json")
    assert results["world_size"] == world_size
    assert all(math.isfinite(results[f"{stage}/loss"]) for stage in ("train", "val", "test"))


@pytest.mark.slow
@requires("dp")
def test_a_sweep_over_dp_and_ddp_spawn_gives_each_job_its_own_dir_and_world_size(tmp_path: Path):
    """Strategy × sweep: each job sets up (and ends) its own strategy, in the one sweep process."""
    sweep_dir = tmp_path / "sweep"
    result = check_ok(
        run_module(
            "project.train",
            "-m",
            "trainer=dp,ddp_spawn",
            "seed=1,2",
            "logger=none",
            f"hydra.sweep.dir={sweep_dir}",
            cwd=tmp_path,
            env=ONE_THREAD,
        )
    )
    jobs = job_dirs(sweep_dir)
    assert [job.name for job in jobs] == ["0", "1", "2", "3"]
    # Toy: 5 points, batch 2, last batch dropped; dp sees all 4 per epoch, each ddp_spawn rank its padded 3 → 2.
    expected = [("dp", 1, 1, 4), ("dp", 2, 1, 4), ("ddp_spawn", 1, 2, 2), ("ddp_spawn", 2, 2, 2)]
    for job, (trainer, seed, world_size, samples) in zip(jobs, expected, strict=True):
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        assert f"trainer={trainer}" in overrides and f"seed={seed}" in overrides
        assert_finite_run(job, world_size, [samples] * 3, steps=3 * samples // 2)
        assert last_checkpoint(job)["global_step"] == 3 * samples // 2
    last_losses = [histories(job)[0]["step_losses"][-1] for job in jobs]
    assert last_losses[0] != last_losses[1] and last_losses[2] != last_losses[3], "seeds 1 and 2 train differently"
    assert result.stdout.count("Results") == 4
    summary = result.stdout[result.stdout.index("Sweep: 4 job(s)") :]
    assert all(str(job) in summary for job in jobs)
    assert not (tmp_path / "outputs").exists(), "no stray run dirs"


@pytest.mark.slow
@requires("optuna")
def test_an_optuna_search_under_ddp_runs_each_trial_once_on_both_ranks(tmp_path: Path, mnist_root: Path):
    """Strategy × Optuna: rank 1 must join its trial as a single run, not start a study of its own."""
    sweep_dir = tmp_path / "search"
    result = check_ok(
        run_module(
            "project.train",
            *mnist_overrides(mnist_root, "trainer=ddp", "trainer.devices=2", "trainer.max_epochs=1"),
            "hydra.mode=MULTIRUN",
            "hparams_search=mnist_optuna",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.sampler.n_startup_trials=2",
            f"hydra.sweep.dir={sweep_dir}",
            cwd=tmp_path,
            env=ONE_THREAD,
        )
    )
    jobs = job_dirs(sweep_dir)
    assert [job.name for job in jobs] == ["0", "1"]
    for job in jobs:
        trial = dict(o.split("=", 1) for o in OmegaConf.load(job / ".hydra" / "overrides.yaml"))
        steps = -(-175 // int(trial["data.batch_size"]))  # 175 images per rank in the trial's batch size
        assert_finite_run(job, 2, [175], steps=steps)
        assert last_checkpoint(job)["global_step"] == steps
        nested = [path for path in job.rglob("results.json") if path.parent != job]
        assert nested == [], f"a job dir inside a job: {nested}"
    assert not (tmp_path / "outputs").exists(), "rank 1 started no study of its own"
    assert "Sweep: 2 job(s)" in result.stdout


@pytest.fixture(scope="module")
def one_epoch_ddp_run(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> Path:
    """A finished 1-epoch DDP run on the small MNIST files (no schedule), in <base>/outputs/first: resume from it."""
    base = tmp_path_factory.mktemp("earlier-ddp")
    check_ok(
        run_module(
            "project.train",
            *resume_overrides(mnist_root, "trainer=ddp", "trainer.max_epochs=1"),
            "hydra.run.dir=outputs/first",
            cwd=base,
            env=ONE_THREAD,
        )
    )
    return base / "outputs" / "first"


def resume_overrides(mnist_root: Path, *extra: str) -> list[str]:
    """7 steps per epoch per rank (175 images each, batch 25), a constant learning rate: epochs can be added."""
    return mnist_overrides(mnist_root, "model.scheduler=null", "data.batch_size=25", "trainer.devices=2", *extra)


@pytest.mark.slow
@pytest.mark.parametrize(("trainer", "resume"), [("ddp", "file"), ("ddp", "last"), ("ddp_spawn", "file")])
def test_a_ddp_run_resumes_on_every_rank_to_the_step_count_of_the_whole_run(
    tmp_path: Path, mnist_root: Path, one_epoch_ddp_run: Path, trainer: str, resume: str
):
    """Strategy × resume: both ranks continue from epoch 1; last.ckpt's step = 2 epochs × 7 steps per rank."""
    earlier = one_epoch_ddp_run / "checkpoints" / "last.ckpt"
    assert last_checkpoint(one_epoch_ddp_run)["global_step"] == 7
    run_dir = tmp_path / "resumed"
    check_ok(
        run_module(
            "project.train",
            *resume_overrides(mnist_root, f"trainer={trainer}", "trainer.max_epochs=2"),
            f"ckpt_path={earlier if resume == 'file' else 'last'}",
            f"hydra.run.dir={run_dir}",
            cwd=one_epoch_ddp_run.parent.parent if resume == "last" else tmp_path,
            env=ONE_THREAD,
        )
    )
    ranks = histories(run_dir)
    assert [(h["first_epoch"], h["world_size"], h["epoch_samples"]) for h in ranks] == [(1, 2, [175])] * 2
    assert read_json(run_dir / "results.json")["epochs"] == 2
    checkpoint = last_checkpoint(run_dir)
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (1, 14)
    assert checkpoint["config"]["ckpt_path"] == str(earlier), "the stored config names the file resumed from"


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["ddp", pytest.param("dp", marks=requires("dp"))])
def test_bf16_mixed_trains_under_ddp_and_dp(tmp_path: Path, mnist_root: Path, trainer: str):
    """Strategy × precision: autocast reaches every rank's (or replica's) forward pass and the losses stay finite."""
    run_dir = tmp_path / "run"
    check_ok(
        run_module(
            "project.train",
            *mnist_overrides(mnist_root, f"trainer={trainer}", "trainer.precision=bf16-mixed"),
            "trainer.max_epochs=1",
            "data.batch_size=50",
            f"hydra.run.dir={run_dir}",
            cwd=tmp_path,
            env=ONE_THREAD,
        )
    )
    if trainer == "ddp":
        assert_finite_run(run_dir, 2, [175], steps=4)  # 175 images per rank: 3 batches of 50 and one of 25
    else:
        assert_finite_run(run_dir, 1, [TRAIN_IMAGES], steps=7)
    assert last_checkpoint(run_dir)["config"]["trainer"]["precision"] == "bf16-mixed"


EXTRA_EXPERIMENT = """\
# @package _global_
# A user's own recipe, outside conf/: a distinctive seed and batch size.
defaults:
  - override /data: mnist
  - override /model: mnist_mlp

seed: 4242
data:
  root: {root}
  download: false
  val_size: 50
  batch_size: 40
  drop_last: true
trainer:
  max_epochs: 1
"""


def user_config_source(source: str, tmp_path: Path, mnist_root: Path) -> list[str]:
    """The command-line arguments that pick `experiment/extra.yaml` from outside conf/ in the way `source` names."""
    experiment = EXTRA_EXPERIMENT.format(root=mnist_root)
    if source == "searchpath":
        (tmp_path / "extra" / "experiment").mkdir(parents=True)
        (tmp_path / "extra" / "experiment" / "extra.yaml").write_text(experiment)
        return [f"hydra.searchpath=[file://{tmp_path / 'extra'}]", "experiment=extra"]
    copy = tmp_path / "conf"
    shutil.copytree(CONF_DIR, copy)
    (copy / "experiment" / "extra.yaml").write_text(experiment)
    if source == "config-dir":
        return [f"--config-dir={copy}", "experiment=extra"]
    train = (copy / "train.yaml").read_text()
    other = re.sub(r"- experiment: \w+", "- experiment: extra", train)
    assert other != train
    (copy / f"{OTHER_NAME}.yaml").write_text(other)
    return [f"--config-dir={copy}", f"--config-name={OTHER_NAME}"]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["config-dir", "config-name", "searchpath"])
def test_ddp_ranks_train_the_users_config_from_outside_conf(tmp_path: Path, mnist_root: Path, source: str):
    """Strategy × config source: rank 1 composes from the same source as rank 0, so both train seed 4242, batch 40."""
    run_dir = tmp_path / "run"
    check_ok(
        run_module(
            "project.train",
            *user_config_source(source, tmp_path, mnist_root),
            "trainer=ddp",
            "logger=none",
            f"hydra.run.dir={run_dir}",
            cwd=tmp_path,
            env=ONE_THREAD,
        )
    )
    # 175 images per rank in batches of 40, the last incomplete one dropped: 4 steps, 160 images.
    assert_finite_run(run_dir, 2, [160], steps=4)
    assert (run_dir / "train.rank1.log").is_file() and not (tmp_path / "outputs").exists()
    assert [path.parent.name for path in run_dir.rglob("config.yaml")] == [".hydra"], "rank 0 alone saves .hydra"
    stored = last_checkpoint(run_dir)["config"]
    assert (stored["seed"], stored["data"]["batch_size"]) == (4242, 40)
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").seed == 4242


@pytest.mark.slow
def test_a_scheduled_ddp_run_killed_and_resumed_from_its_file_ends_exactly_as_if_never_stopped(
    tmp_path: Path, mnist_root: Path
):
    """Schedule × resume under DDP from a file (test_workflow resumes `last` and compares weights to 1e-6): the
    one-cycle schedule continues from its step, so weights, Adam's moments and the schedule match bit for bit."""
    args = mnist_overrides(mnist_root, "trainer=ddp", "trainer.max_epochs=2", "data.batch_size=25")
    check_ok(run_module("project.train", *args, "hydra.run.dir=whole", cwd=tmp_path, env=ONE_THREAD))
    crash = ["+callbacks.crash._target_=tests.crash_callback.KillAtEpochStart", "+callbacks.crash.epoch=1"]
    killed = run_module("project.train", *args, *crash, "hydra.run.dir=killed", cwd=tmp_path, env=WITH_TEST_CALLBACKS)
    assert killed.returncode != 0
    assert last_checkpoint(tmp_path / "killed")["global_step"] == 7
    check_ok(
        run_module(
            "project.train",
            *args,
            f"ckpt_path={tmp_path / 'killed' / 'checkpoints' / 'last.ckpt'}",
            TRUST_TEST_CODE,
            "hydra.run.dir=resumed",
            cwd=tmp_path,
            env=ONE_THREAD,
        )
    )
    whole, resumed = last_checkpoint(tmp_path / "whole"), last_checkpoint(tmp_path / "resumed")
    assert resumed["global_step"] == whole["global_step"] == 14
    assert resumed["lr_schedulers"] == whole["lr_schedulers"]
    assert whole["lr_schedulers"][0]["last_epoch"] == 14, "the schedule stepped once per optimizer step"
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), f"{name} differs after resuming"
    assert whole["optimizer_states"][0]["state"], "Adam's moments are in the checkpoint"
    for key, state in whole["optimizer_states"][0]["state"].items():
        resumed_state = resumed["optimizer_states"][0]["state"][key]
        assert all(torch.equal(value, resumed_state[name]) for name, value in state.items())
