"""DataParallel for Lightning 2.x, which removed its `strategy="dp"`: `nn.DataParallel` in one process.

DataParallel replicates the network on every listed GPU at each forward pass, splits the batch along dim 0
between them, and gathers the outputs on the first GPU. Here only the LightningModule's network
(`module_attribute`, "network" by default) is wrapped, not the LightningModule: the loss, the torchmetrics and
`self.log` then run once, in the main thread, on the gathered outputs of the whole batch, so they are logged once
and need no per-replica reduction (what made Lightning 1.x's version fragile). Checkpoints hold the plain network's
keys, without DataParallel's `module.` prefix. The replicas run under the caller's autocast dtype
(`AutocastDataParallel`), so `precision=bf16-mixed` stays bfloat16 on every GPU.

Without a GPU there is nothing to split over: the strategy says so in one line and trains on the one device.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.nn import DataParallel, Module

from project.engine.build import CompileNetworks
from project.engine.errors import UserError


def under_callers_autocast(module: Callable[..., Any], device_type: str) -> Callable[..., Any]:
    """Bind `module` to this thread's autocast state for `device_type`, to be called from another thread.

    Autocast state (on/off and dtype) is per thread, and `parallel_apply` re-enters autocast in each worker thread
    with only `enabled`: the dtype falls back to the device's default, float16 on CUDA, so `bf16-mixed` would run
    the replicas in float16. Called in the thread that holds the state, this carries both into the replica's thread.
    """
    enabled = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type)

    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            return module(*args, **kwargs)

    return forward


class AutocastDataParallel(DataParallel):
    """`nn.DataParallel` whose replicas run under the caller's autocast dtype instead of the device's default."""

    def parallel_apply(self, replicas: Sequence[Module], inputs: Sequence[Any], kwargs: Any) -> list[Any]:
        device_type = self.src_device_obj.type
        return super().parallel_apply([under_callers_autocast(r, device_type) for r in replicas], inputs, kwargs)


class DataParallelStrategy(ParallelStrategy):
    """One process; the network's forward pass split over `parallel_devices` (the Trainer's `devices`)."""

    strategy_name = "dp"
    is_distributed = False

    def __init__(self, module_attribute: str = "network", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module_attribute = module_attribute
        self._said_no_gpu = False

    @property
    def num_nodes(self) -> int:
        return 1

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        if num_nodes != 1:
            raise UserError(
                f"trainer=dp runs in one process on one machine, so trainer.num_nodes must be 1 (got {num_nodes}); "
                "for several nodes use trainer=slurm (or trainer=ddp)"
            )

    def setup_environment(self) -> None:
        """Refuses a launch of several processes (srun with more than one task): each would run DataParallel over
        the same GPUs, and train the whole data on its own."""
        environment = self.cluster_environment
        processes = environment.world_size() if environment and environment.creates_processes_externally else 1
        if processes != 1:
            raise UserError(
                f"trainer=dp runs in one process, but its launcher started {processes}: start one (under Slurm, "
                "--ntasks-per-node=1 on one node), or use trainer=ddp (trainer=slurm) for one process per device"
            )
        super().setup_environment()

    def setup(self, trainer: L.Trainer) -> None:
        """Refuses `compile=true`: DataParallel copies the network onto every GPU at each step, and the copies would
        run the original's compiled code (`project.engine.build`)."""
        if any(isinstance(callback, CompileNetworks) for callback in trainer.callbacks):
            raise UserError(
                "compile=true with trainer=dp: DataParallel copies the network onto every GPU at each step, and the "
                "copies would run the original's compiled code; use trainer=ddp with compile=true, or compile=false"
            )
        super().setup(trainer)

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0]

    @property
    def distributed_sampler_kwargs(self) -> None:
        return None  # one process reads every batch: no DistributedSampler

    def model_to_device(self) -> None:
        self.model.to(self.root_device)

    def _setup_model(self, model: Module) -> Module:
        network = getattr(self.lightning_module, self.module_attribute, None)
        if not isinstance(network, Module):
            # Refused with or without a GPU, so a run tried on a laptop behaves as it will on the GPU machine.
            raise UserError(
                f"trainer=dp splits each batch over the GPUs in the module's `{self.module_attribute}` network, "
                f"which {type(self.lightning_module).__name__} has no nn.Module attribute of that name for: set "
                "trainer.strategy.module_attribute=<the attribute that holds its network>, or use trainer=ddp"
            )
        if self.root_device.type != "cuda":
            if self._said_no_gpu:
                return model
            self._said_no_gpu = True
            rank_zero_info(f"dp: no GPU in use, so DataParallel does not split batches: training on {self.root_device}")
        elif not isinstance(network, DataParallel):
            device_ids = [device.index for device in self.parallel_devices]
            setattr(self.lightning_module, self.module_attribute, AutocastDataParallel(network, device_ids=device_ids))
        return model

    @contextmanager
    def _plain_network(self) -> Iterator[None]:
        """Put the unwrapped network back for the duration, so state dicts carry no `module.` prefix."""
        network = getattr(self.lightning_module, self.module_attribute, None)
        if not isinstance(network, DataParallel):
            yield
            return
        setattr(self.lightning_module, self.module_attribute, network.module)
        try:
            yield
        finally:
            setattr(self.lightning_module, self.module_attribute, network)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        with self._plain_network():
            return super().lightning_module_state_dict()

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        with self._plain_network():
            super().load_model_state_dict(checkpoint, strict=strict)

    def teardown(self) -> None:
        network = getattr(self.lightning_module, self.module_attribute, None)
        if isinstance(network, DataParallel):
            setattr(self.lightning_module, self.module_attribute, network.module)
        super().teardown()

    # One process: collectives have nothing to combine.
    def reduce(self, tensor: Tensor | Any, *args: Any, **kwargs: Any) -> Tensor | Any:
        return tensor

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        return tensor

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision
