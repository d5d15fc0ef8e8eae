"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for any LightningModule, its ranks started as `trainer=ddp` starts them.

Lightning's `FSDPStrategy` refuses CPUs and wraps with FSDP1; its `ModelParallelStrategy` runs FSDP2 on any device
type (gloo on CPUs, NCCL on GPUs) but asks the LightningModule to shard itself in `configure_model`. This strategy
shards a module that does not, in `shard_module`: the submodules `project.optional.fsdp.units` chooses (whole blocks,
or those of `layer_classes`) each become an FSDP unit of their own (their parameters all-gathered just before their
forward and freed after), then each child of the LightningModule that holds parameters (a network) becomes a unit,
which gathers what its units left over, and the LightningModule itself the root unit, which holds what the networks
share (an output layer's weight tied to the embedding, in two networks). FSDP2 runs a unit's gathering around its
module's forward, and names as root the first unit whose forward runs; Lightning calls `training_step`, not
`forward`, so this strategy calls each step as the module's forward (`through_forward`), as Lightning does for a
wrapped module. A module that implements `configure_model` shards itself there, as Lightning documents, and is left
as it is.

Each rank holds 1/world_size of every parameter, gradient and optimizer state; the data is split over the ranks as
under DDP (one data-parallel mesh dimension of world_size ranks), so the same global batch gives the same steps.
"""

import dataclasses
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from project.engine.build import networks_of
from project.engine.checkpoints import check_shards, deletable, is_sharded, refuse_a_url
from project.engine.ddp import HydraJobRanks
from project.engine.errors import UserError
from project.optional.fsdp.checkpoints import new_version_dir, optimizer_state_by_name, publish, remove
from project.optional.fsdp.units import KEY, UnitChoice, network_units

# Trainer precisions FSDP2 trains in here; the others are refused as the Trainer is built.
FSDP_PRECISIONS = ("32-true", "32", "bf16-mixed")
# torch's words for an operation given a sharded parameter (a DTensor) beside plain tensors.
MIXED_TENSORS = "got mixed torch.Tensor and DTensor"


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """bf16-mixed: parameters all-gathered in bfloat16 for the forward and backward (half the traffic), gradients
    reduced and stored in float32 beside float32 master weights; Lightning's autocast still runs the step, so the
    loss is computed in float32 as under DDP. 32-true: everything in float32."""
    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_module(module: nn.Module, units: UnitChoice, mesh: DeviceMesh, policy: MixedPrecisionPolicy) -> None:
    """Shard `module` (a LightningModule) in place: its units, then its networks
    (`project.engine.build.networks_of`: the children that hold parameters) that share nothing, then `module`, the
    root unit (see the module docstring).

    The networks keep their weights gathered from their forward to their backward (`reshard_after_forward=False`), as
    the root does: a network is called once a step, and gathering it again for the backward would only add traffic.
    The root does not cast the step's inputs to bfloat16 (its networks cast theirs): a batch's floats (a regression's
    targets) stay as the data module gave them. Parameters of `module`'s own (not in a child) are refused in one
    line: only what its networks share is meant for the root unit, gathered inside a step alone.
    """
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise UserError(
            f"trainer=fsdp shards the submodules of {type(module).__name__}, which holds parameters of its own "
            f"({', '.join(own)}): move them into a submodule, or shard the module yourself in its configure_model"
        )
    networks = networks_of(module)
    shard_units(module, units, mesh, policy, roots=list(networks))
    for name in network_units(module, networks):
        if not isinstance(networks[name], FSDPModule):  # a network that is also a unit inside another (an alias)
            fully_shard(networks[name], mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(module, mesh=mesh, mp_policy=dataclasses.replace(policy, cast_forward_inputs=False))


def through_forward(module: nn.Module, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)` (a step of `module`), run as `module(*args, **kwargs)`, so that FSDP2 runs the root
    unit's hooks around it (Lightning's `_ForwardRedirection` does the same for a module it wraps). Inside, `self(...)`
    is the module's own forward again."""

    def forward(*call_args: Any, **call_kwargs: Any) -> Any:
        del module.forward
        return call(*call_args, **call_kwargs)

    module.forward = forward
    try:
        return module(*args, **kwargs)
    finally:
        module.__dict__.pop("forward", None)


def name_the_root(module: nn.Module) -> None:
    """Make `module`'s unit the root now. FSDP2 names as root the first unit whose forward runs, and a module's hook
    may call a network before its first step does (the worked example checks its network's outputs on_fit_start):
    that network would become a root, and the module's unit could not. So the root's forward runs once, empty, as
    the module is sharded; what it gathered is put back in its shards."""
    with torch.no_grad():
        through_forward(module, lambda: None)
    reshard(module)


def shard_units(
    module: nn.Module, units: UnitChoice, mesh: DeviceMesh, policy: MixedPrecisionPolicy, roots: Collection[str]
) -> None:
    """Make each unit `project.optional.fsdp.units` chooses in `module` an FSDP unit of its own, innermost first;
    `module` itself and `roots` are the caller's to shard, or not."""
    for name in units.of(module, roots):
        fully_shard(module.get_submodule(name), mesh=mesh, mp_policy=policy)


class ParameterStillSharded(UserError):
    """A unit's parameter read outside the unit's forward. Every rank runs the same forward, so each meets it at the
    same step; as for a signal's stop, the ranks rank 0 started write their line to their log files, and rank 0
    alone prints it."""

    on_every_rank = True


def reshard(module: nn.Module) -> None:
    """Put every FSDP unit of `module` back in its shards. A forward that no backward follows (Lightning's count of
    FLOPs on `example_input_array` as fitting starts) leaves a root unit's parameters gathered, as whole tensors,
    where a sharded checkpoint reads and writes shards."""
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


@contextmanager
def units_read_where_called() -> Iterator[None]:
    """A step that met a unit's parameter still sharded (a module that reads a submodule's weight without calling
    it, so FSDP never gathered it) ends in one line naming the key that chooses the units, not torch's traceback
    from deep inside the model."""
    try:
        yield
    except RuntimeError as error:
        if MIXED_TENSORS not in str(error):
            raise
        operation = str(error).split(",")[0]  # torch's advice after the comma is for DTensor's own users
        raise ParameterStillSharded(
            "trainer=fsdp met a parameter still sharded: a module read the weight of a submodule that is an FSDP "
            f"unit of its own without calling that submodule ({operation}). Set {KEY} to the "
            f"classes of the blocks that hold both (a transformer's layer class), or to null (whole blocks, the "
            "default)"
        ) from error


class HydraFSDPStrategy(HydraJobRanks, ModelParallelStrategy):
    """FSDP2 over all ranks (`data_parallel` mesh dimension = world size, no tensor parallelism).

    Checkpoints are sharded, written by every rank at once with `torch.distributed.checkpoint`, and atomic:
    `project.optional.fsdp.checkpoints` says how.

    `layer_classes`: import paths of the submodule classes that each become an FSDP unit (a transformer's block
    class, say); None, the config's default, makes units of whole blocks of at least `min_unit_params` parameters
    (`project.optional.fsdp.units`).
    """

    def __init__(
        self,
        layer_classes: list[str] | None,
        min_unit_params: int,
        timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout=timeout, **kwargs)
        self.units = UnitChoice.from_config(layer_classes, min_unit_params)

    @ModelParallelStrategy.precision_plugin.setter
    def precision_plugin(self, precision_plugin: Precision | None) -> None:
        """Refuses, as the Trainer is built, a precision other than those FSDP2's mixed-precision policy is written
        for here (`mixed_precision_policy`): Lightning would take bf16-true or 16-true and train with weights that
        sharding does not expect."""
        precision = None if precision_plugin is None else str(precision_plugin.precision)
        if precision is not None and precision not in FSDP_PRECISIONS:
            raise UserError(
                f"trainer=fsdp trains in 32-true or bf16-mixed (FSDP2's mixed-precision policy), not "
                f"trainer.precision={precision}: set trainer.precision=32-true or bf16-mixed"
            )
        ModelParallelStrategy.precision_plugin.fset(self, precision_plugin)

    def setup_environment(self) -> None:
        self._data_parallel_size, self._tensor_parallel_size = self.num_nodes * self.num_processes, 1
        super().setup_environment()

    def setup(self, trainer: L.Trainer) -> None:
        """Lightning's, with the sharding done here for a module that has no `configure_model`.

        `ModelParallelStrategy.setup` refuses such a module, so its base's setup (precision, device, optimizers:
        built on the sharded parameters, so each rank's optimizer state is its shard's) runs after the sharding.
        The test and predict that follow a fit find the module sharded already.
        """
        module = self.lightning_module
        if is_overridden("configure_model", module):
            super().setup(trainer)
            return
        if not any(isinstance(submodule, FSDPModule) for submodule in module.modules()):
            policy = mixed_precision_policy(str(self.precision_plugin.precision))
            module.to(self.root_device)
            shard_module(module, self.units, self.device_mesh["data_parallel"], policy)
            name_the_root(module)
        ParallelStrategy.setup(self, trainer)

    def module_step(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The LightningModule's step `name`, as Lightning's `Strategy` calls it inside the precision's context for
        it, called as the module's forward where this strategy sharded the module (`through_forward`)."""
        module = self.lightning_module
        with units_read_where_called():
            if is_overridden("configure_model", module):
                return getattr(module, name)(*args, **kwargs)
            return through_forward(module, getattr(module, name), *args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.train_step_context():
            return self.module_step("training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context():
            return self.module_step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context():
            return self.module_step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context():
            return self.module_step("predict_step", *args, **kwargs)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None) -> None:
        """Lightning's sharded save (every rank its shard, rank 0 the rest in `meta.pt`) into a new directory, which
        then replaces the checkpoint at once (`sharded_checkpoints.publish`)."""
        path = Path(self.broadcast(str(filepath)))
        directory = self.broadcast(new_version_dir(path) if self.is_global_zero else None)
        super().save_checkpoint(checkpoint, directory, storage_options)
        self.barrier()  # every shard and meta.pt on disk
        if self.is_global_zero:
            publish(Path(directory), path)
        self.barrier()  # no rank reads the checkpoint before it is in place

    def load_checkpoint(self, checkpoint_path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's for a sharded checkpoint. A single file (written under ddp or on one device, or by the
        converter) every rank reads whole, keeping its shard of each tensor; Lightning's own reading of one renumbers
        the optimizer's state with FSDP1's helper, which fails for an optimizer that keeps none (plain SGD). Either
        is read as data (`weights_only=True`, whatever the caller asks) from a local path, never a URL."""
        refuse_a_url(checkpoint_path)
        path = Path(self.broadcast(str(checkpoint_path)))
        reshard(self.model)  # either way, the checkpoint's tensors go into the shards
        if is_sharded(path):
            check_shards(path)
            return super().load_checkpoint(path, weights_only=True)
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        whole = StateDictOptions(full_state_dict=True, strict=self.lightning_module.strict_loading)
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=whole)
        optimizer_states = checkpoint.pop("optimizer_states", [])
        if self.lightning_module.trainer.state.fn != TrainerFn.FITTING:
            return checkpoint  # a test or prediction after a fit still holds its optimizers, which it does not use
        # As torch's own Optimizer.load_state_dict (what ddp resumes with), a parameter without state is no error: one
        # that never had a gradient, or was frozen when the file was written. (torch starts its state at zeros, as
        # Adam would, but counts one step for it.)
        lenient = StateDictOptions(full_state_dict=True, strict=False)
        for optimizer, state in zip(self.optimizers, optimizer_states, strict=False):  # as Lightning zips them
            if state["state"]:
                by_name = optimizer_state_by_name(state, optimizer, self.model)
                set_optimizer_state_dict(self.model, optimizer, optim_state_dict=by_name, options=lenient)
            else:  # no tensor to shard (torch's sharded loading needs one): the groups' settings alone
                optimizer.load_state_dict(state)
        return checkpoint

    def remove_checkpoint(self, filepath: str | Path) -> None:
        """Delete a checkpoint of this run (of any layout), never a path outside its dir nor a directory that is no
        checkpoint, which a restored callback state may name (`project.engine.checkpoints.deletable`)."""
        path = Path(filepath)
        run_dir = self.lightning_module.trainer.default_root_dir
        if self.is_global_zero and deletable(path, run_dir) and (is_sharded(path) or not path.is_dir()):
            remove(path)
