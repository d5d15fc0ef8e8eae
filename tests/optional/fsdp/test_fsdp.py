"""`trainer=fsdp`: FSDP2 on two CPU processes (gloo) trains any LightningModule, gives the numbers of its reference
script and of DDP on the same global batch, and writes sharded checkpoints that resume exactly and load on one
process."""

import math
import signal
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from project.engine.build import build
from project.engine.checkpoints import optimizer_state_by_index
from project.engine.errors import UserError
from project.optional.fsdp.checkpoints import main as checkpoints_main
from project.optional.fsdp.checkpoints import new_version_dir, optimizer_state_by_name, publish, remove
from project.optional.fsdp.strategy import shard_module
from project.optional.fsdp.units import UnitChoice
from tests.collective_counter import count_collectives
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import (
    MID_EPOCH_ON,
    REPO,
    TRUST_TEST_CODE,
    check_ok,
    free_port,
    histories,
    last_weights,
    one_rank_process_group,
    read_json,
    requires,
    run_module,
)
from tests.test_config import compose_train

TOLERANCE = 1e-6
# 5 toy points over 2 ranks, 1 a batch: 3 steps per epoch on each rank, 9 in all. Adam, whose state (two moments
# per weight) is sharded too, and so resumed from the shards.
TOY = [
    "trainer.devices=2",
    "data.batch_size=1",
    "logger=none",
    "model.optimizer._target_=torch.optim.Adam",
    "model.optimizer.lr=0.05",
]
ENV = {"PYTHONPATH": str(REPO)}  # lets a run import tests.crash_callback and tests.foreign_modules


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of `trainer=fsdp` on the toy, over 2 ranks: 3 epochs never stopped."""
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    check_ok(run_module("project.train", "trainer=fsdp", *TOY, f"hydra.run.dir={run_dir}", cwd=run_dir.parent))
    return run_dir


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`project.optional.reference.compare trainer=fsdp` on the toy: its run dir (the Lightning side in lightning/)."""
    run_dir = tmp_path_factory.mktemp("fsdp-compared") / "compare"
    compare = ("project.optional.reference.compare", "trainer=fsdp", *TOY, f"hydra.run.dir={run_dir}")
    check_ok(run_module(*compare, cwd=run_dir.parent))
    return run_dir


def max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first and first.keys() == second.keys()
    return max((first[name].double() - second[name].double()).abs().max().item() for name in first)


@pytest.mark.slow
def test_fsdp_matches_ddp_step_by_step(tmp_path: Path, fsdp_run: Path):
    ddp_dir = tmp_path / "ddp"
    check_ok(run_module("project.train", "trainer=ddp", *TOY, f"hydra.run.dir={ddp_dir}", cwd=tmp_path))
    fsdp_ranks, ddp_ranks = histories(fsdp_run), histories(ddp_dir)
    assert [len(h["step_losses"]) for h in fsdp_ranks] == [9, 9]
    for fsdp, ddp in zip(fsdp_ranks, ddp_ranks, strict=True):
        assert max(abs(a - b) for a, b in zip(fsdp["step_losses"], ddp["step_losses"], strict=True)) <= TOLERANCE
    assert max_difference(last_weights(fsdp_run), last_weights(ddp_dir)) <= TOLERANCE


@pytest.mark.slow
@requires("reference")
def test_fsdp_matches_its_reference_step_by_step(compared: Path):
    comparison = read_json(compared / "comparison.json")
    assert comparison["reference_script"] == "project.optional.reference.fsdp"
    assert comparison["world_size"] == {"lightning": 2, "reference": 2}
    assert comparison["max_step_loss_diff"] <= TOLERANCE and comparison["max_weight_diff"] <= TOLERANCE


@pytest.mark.slow
def test_a_module_of_the_users_own_is_sharded_without_a_configure_model_and_compiled(tmp_path: Path):
    regression = ["model=regression", "data=regression", "optimized_metric=val/mse", "optimized_mode=min"]
    run_dir = tmp_path / "run"
    check_ok(
        run_module(
            "project.train",
            f"hydra.searchpath=[file://{FOREIGN_CONF}]",
            *regression,
            "trainer=fsdp",
            "compile=true",
            "trainer.max_epochs=2",
            "logger=none",
            f"hydra.run.dir={run_dir}",
            cwd=tmp_path,
            env={"PYTHONPATH": str(REPO)},
        )
    )
    results = read_json(run_dir / "results.json")
    assert results["world_size"] == 2 and math.isfinite(results["test/mse"])
    assert [h["world_size"] for h in histories(run_dir)] == [2, 2]


@pytest.mark.slow
def test_a_module_that_shards_itself_in_configure_model_is_left_as_it_sharded_itself(tmp_path: Path):
    run_dir = tmp_path / "run"
    own = ["model=regression", "model._target_=tests.foreign_modules.SelfShardingRegression", "data=regression"]
    metric = ["optimized_metric=val/mse", "optimized_mode=min"]
    overrides = [*own, *metric, "trainer=fsdp", "trainer.max_epochs=1", "logger=none", f"hydra.run.dir={run_dir}"]
    search_path = f"hydra.searchpath=[file://{FOREIGN_CONF}]"
    check_ok(run_module("project.train", search_path, *overrides, cwd=tmp_path, env=ENV))
    assert read_json(run_dir / "results.json")["world_size"] == 2


def test_fsdp_refuses_a_precision_other_than_32_true_and_bf16_mixed_as_the_trainer_is_built(tmp_path: Path):
    build(compose_train(tmp_path, "trainer=fsdp", "trainer.precision=bf16-mixed"), tmp_path / "outputs")
    with pytest.raises(UserError, match=r"trainer=fsdp trains in 32-true or bf16-mixed .* trainer.precision=bf16-true"):
        build(compose_train(tmp_path, "trainer=fsdp", "trainer.precision=bf16-true"), tmp_path / "outputs")


def test_parameters_outside_any_submodule_are_refused_before_sharding():
    module = nn.Module()
    module.layer = nn.Linear(2, 2)
    module.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(UserError, match=r"holds parameters of its own \(scale\)"):
        shard_module(module, UnitChoice((nn.Linear,), 0), mesh=None, policy=None)


@pytest.mark.slow
@requires("mid_epoch")  # the SIGTERM checkpoint
def test_a_sharded_checkpoint_resumes_exactly_under_fsdp_and_ddp_and_loads_on_one_process(
    tmp_path: Path, fsdp_run: Path
):
    """SIGTERM during step 3: every rank stops after step 5 (inside epoch 1) and writes its shard. Resumed under fsdp
    from the shards, under ddp from them assembled, and under fsdp from the converter's single file, each run trains
    the remaining steps and ends on the weights of the run never stopped; evaluate reads the shards in one process."""
    stopped_dir = tmp_path / "stopped"
    at_step_3 = ["+callbacks.crash._target_=tests.crash_callback.SignalAtStep", "+callbacks.crash.step=3"]
    stop = [*at_step_3, "+callbacks.crash.signal=SIGTERM", MID_EPOCH_ON]
    stopped = run_module(
        "project.train", "trainer=fsdp", *TOY, *stop, f"hydra.run.dir={stopped_dir}", cwd=tmp_path, env=ENV
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    last = stopped_dir / "checkpoints" / "last.ckpt"
    assert f"(step 5) with the same command plus ckpt_path={last}" in stopped.stderr
    assert last.is_symlink() and sorted(p.name for p in last.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    ], "one shard per rank, DCP's index, and Lightning's metadata"
    plain = tmp_path / "plain.ckpt"
    assert check_ok(run_module("project.optional.fsdp.checkpoints", str(last), str(plain), cwd=tmp_path)).stdout
    written = torch.load(plain, weights_only=True)
    assert written["global_step"] == 5 and written["config"]["trainer"]["devices"] == 2

    whole = fsdp_run
    expected = last_weights(whole)
    for strategy, checkpoint in (("fsdp", last), ("ddp", last), ("fsdp", plain)):
        resumed_dir = tmp_path / f"resumed-{strategy}-{checkpoint.name}"
        resume = [
            f"trainer={strategy}",
            *TOY,
            f"ckpt_path={checkpoint}",
            TRUST_TEST_CODE,
            f"hydra.run.dir={resumed_dir}",
        ]
        check_ok(run_module("project.train", *resume, cwd=tmp_path, env=ENV))
        for again, once in zip(histories(resumed_dir), histories(whole), strict=True):
            assert again["first_step"] == 5 and again["step_losses"] == once["step_losses"][5:], (strategy, checkpoint)
        final = last_weights(resumed_dir)
        assert all(torch.equal(final[name], tensor) for name, tensor in expected.items()), (strategy, checkpoint)

    sharded = tmp_path / "resumed-fsdp-last.ckpt" / "checkpoints" / "last.ckpt"
    evaluated = check_ok(run_module("project.evaluate", f"ckpt_path={sharded}", cwd=tmp_path))
    printed = dict(line.split() for line in evaluated.stdout.splitlines() if line.startswith("test/"))
    results = read_json(sharded.parents[1] / "results.json")
    assert float(printed["test/loss"]) == pytest.approx(results["test/loss"], abs=5e-5)


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_at_an_epochs_end_on_another_number_of_processes(tmp_path: Path, fsdp_run: Path):
    """Written by 2 ranks after epoch 3, resumed by 1 under fsdp (DCP reshards as it loads): epoch 4 trains as it
    does for one process resuming the checkpoint unsharded."""
    last = fsdp_run / "checkpoints" / "last.ckpt"
    one_process = [*TOY[1:], "trainer.devices=1", "trainer.max_epochs=4", f"ckpt_path={last}"]
    for trainer in ("fsdp", "cpu"):
        run_dir = tmp_path / trainer
        check_ok(
            run_module("project.train", f"trainer={trainer}", *one_process, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        )
    sharded, plain = (histories(tmp_path / trainer) for trainer in ("fsdp", "cpu"))
    assert [(h["world_size"], h["first_step"]) for h in sharded] == [(1, 9)]
    assert len(sharded[0]["step_losses"]) == 5 and sharded[0]["step_losses"] == plain[0]["step_losses"]


@pytest.mark.slow
@requires("reference")
def test_the_reference_resumes_its_gathered_checkpoint_into_the_shards_exactly(tmp_path: Path, compared: Path):
    """The reference's fsdp writes one whole last.pt (gathered from the shards) at epoch 1's end; resumed from it,
    each rank keeps its shard and the run trains the steps of the reference run never stopped."""
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    for run_dir, more in (
        (first, ["trainer.max_epochs=1"]),
        (resumed, [f"ckpt_path={first / 'checkpoints' / 'last.pt'}"]),
    ):
        launcher = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}")
        overrides = ["trainer=fsdp", *TOY, *more, f"hydra.run.dir={run_dir}"]
        check_ok(run_module("project.optional.reference.fsdp", *overrides, cwd=tmp_path, launcher=launcher))
    for again, once in zip(histories(resumed), histories(compared / "reference"), strict=True):
        assert again["first_step"] == 3 and again["step_losses"] == once["step_losses"][3:]
    weights = torch.load(resumed / "checkpoints" / "model.pt", weights_only=True)
    expected = torch.load(compared / "reference" / "checkpoints" / "model.pt", weights_only=True)
    assert expected.keys() == weights.keys() and all(torch.equal(weights[k], v) for k, v in expected.items())


def test_optimizer_state_is_renumbered_both_ways_and_a_parameter_without_state_is_no_error(tmp_path: Path):
    """Two groups listing parameters out of the module's order, a frozen parameter, one that never had a gradient:
    DCP's layout (by name) and torch's (by number) convert into each other, and a single file's state loads into a
    sharded module as torch's own `load_state_dict` loads it (what `HydraFSDPStrategy.load_checkpoint` does)."""

    def network() -> nn.Module:
        torch.manual_seed(0)
        layers = nn.ModuleDict({"a": nn.Linear(3, 4), "b": nn.Linear(4, 2), "unused": nn.Linear(2, 2)})
        layers["a"].bias.requires_grad_(False)
        return layers

    def adam(layers: nn.Module) -> torch.optim.Optimizer:
        later_first = [layers["b"].weight, layers["a"].weight, layers["unused"].weight]
        return torch.optim.Adam([{"params": later_first, "lr": 0.1}, {"params": [layers["b"].bias], "lr": 0.01}])

    plain = network()
    optimizer = adam(plain)
    plain["b"](plain["a"](torch.randn(5, 3))).sum().backward()
    optimizer.step()
    by_index = optimizer.state_dict()
    assert sorted(by_index["state"]) == [0, 1, 3], "the unused layer's weight (number 2) has no state"
    by_name = optimizer_state_by_name(by_index, optimizer, plain)
    assert by_name["param_groups"][0]["params"] == ["b.weight", "a.weight", "unused.weight"]
    again = optimizer_state_by_index(by_name)
    assert again["param_groups"] == by_index["param_groups"] and again["state"].keys() == by_index["state"].keys()

    with one_rank_process_group(tmp_path):
        sharded = network()
        mesh = init_device_mesh("cpu", (1,))
        for layer in sharded.values():
            fully_shard(layer, mesh=mesh)
        sharded_optimizer = adam(sharded)
        options = StateDictOptions(full_state_dict=True, strict=False)
        by_name = optimizer_state_by_name(by_index, sharded_optimizer, sharded)
        set_optimizer_state_dict(sharded, sharded_optimizer, optim_state_dict=by_name, options=options)
        loaded = get_optimizer_state_dict(sharded, sharded_optimizer, options=StateDictOptions(full_state_dict=True))
    assert torch.equal(loaded["state"]["b.weight"]["exp_avg"], by_index["state"][0]["exp_avg"])
    unused = loaded["state"]["unused.weight"]
    assert not unused["exp_avg"].any() and not unused["exp_avg_sq"].any(), "as Adam starts a parameter: zeros"
    assert [group["lr"] for group in loaded["param_groups"]] == [0.1, 0.01]


def test_a_save_killed_before_it_finished_leaves_the_previous_checkpoint_in_place(tmp_path: Path):
    path = tmp_path / "last.ckpt"
    first = Path(new_version_dir(path))
    (first / "meta.pt").write_text("first")
    publish(first, path)
    killed = Path(new_version_dir(path))  # a save that never reached publish
    (killed / "__0_0.distcp").write_text("half")
    assert (path / "meta.pt").read_text() == "first"
    second = Path(new_version_dir(path))
    assert not killed.exists(), "the next save clears what a killed one left"
    (second / "meta.pt").write_text("second")
    publish(second, path)
    assert (path / "meta.pt").read_text() == "second" and not first.exists()


@pytest.mark.parametrize("layout", ["file", "directory"])
def test_a_sharded_save_over_a_checkpoint_of_another_layout_replaces_it(tmp_path: Path, layout: str):
    """A run resumed under trainer=fsdp from a single-file last.ckpt (ddp's), or a directory left in its place."""
    path = tmp_path / "last.ckpt"
    if layout == "file":
        path.write_text("ddp's single file")
    else:
        (path / "old").mkdir(parents=True)
    version = Path(new_version_dir(path))
    (version / "meta.pt").write_text("sharded")
    publish(version, path)
    assert path.is_symlink() and path.resolve() == version.resolve()
    assert sorted(p.name for p in path.iterdir()) == ["meta.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.ckpt", version.name])


def test_removing_a_checkpoint_of_each_layout_leaves_nothing_of_it(tmp_path: Path):
    sharded = tmp_path / "sharded.ckpt"
    version = Path(new_version_dir(sharded))
    (version / "meta.pt").write_text("sharded")
    publish(version, sharded)
    (tmp_path / "directory.ckpt").mkdir()
    (tmp_path / "directory.ckpt" / "meta.pt").write_text("a directory")
    (tmp_path / "file.ckpt").write_text("a file")
    for name in ("sharded.ckpt", "directory.ckpt", "file.ckpt", "never-written.ckpt"):
        remove(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_the_plain_file_writer_refuses_a_path_that_is_not_a_sharded_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    single = tmp_path / "last.ckpt"
    single.write_text("a single-file checkpoint")
    monkeypatch.setattr(sys, "argv", ["checkpoints.py", str(single), str(tmp_path / "plain.ckpt")])
    with pytest.raises(SystemExit) as exited:
        checkpoints_main()
    assert exited.value.code == 2
    assert f"error: {single} is not a sharded checkpoint (a directory with meta.pt)" in capsys.readouterr().err
    assert not (tmp_path / "plain.ckpt").exists()


@pytest.mark.slow
def test_a_training_step_issues_no_collective_but_the_shardings_and_agrees_on_sigterm_beside_it(tmp_path: Path):
    """Per step, the training group carries only what sharding needs (FSDP2's all-gathers of each unit's weights and
    its gradient reduce-scatters), and the SIGTERM agreement is one all-reduce on its own
    CPU group (as under DDP: tests/test_switches.py)."""
    run_dir = tmp_path / "run"
    overrides = ["trainer=fsdp", *TOY, "trainer.log_every_n_steps=100", *count_collectives(run_dir)]
    check_ok(run_module("project.train", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ENV))
    # One unit, the network (the toy's 752 weights are far below min_unit_params): gathered for the forward, kept so for
    # the backward (reshard_after_forward=False), its gradients reduce-scattered; the root unit holds nothing.
    sharding = {"training": {"all_gather_single": 1, "reduce_scatter_single": 1}}
    expected = {"agreement": {"allreduce": 1}} | sharding
    for rank in (0, 1):
        assert read_json(run_dir / f"collectives.rank{rank}.json") == [expected] * 6, "2 steps in each of 3 epochs"
