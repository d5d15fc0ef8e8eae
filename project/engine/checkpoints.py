"""Checkpoints: which one a run resumes from; refusing files that are not Lightning checkpoints, weights that do not fit
and resumes the data cannot carry on; what a resumed one restores, checked before Lightning uses it
(`RestoredStateCheck`); writing them whole; keeping the best one (`BestCheckpoint`); and a new run started from a
file's weights, parts of it frozen (`start_from_weights`, `freeze_parameters`: fine-tuning)."""

import contextlib
import io
import itertools
import math
import os
import pickle
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path, PurePath
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.model_helpers import is_overridden
from packaging.version import InvalidVersion, Version
from torch import Tensor
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.nn.parameter import is_lazy
from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler, Subset

from project.engine.ddp import torchs_own_order
from project.engine.errors import UserError, disk_refuses, nearest_existing, quoted, unwritable
from project.engine.run_dir import names_a_url, plain_path_inside
from project.engine.run_log import printable, report
from project.engine.sweeps import in_a_search
from project.engine.trusted_targets import TrustedTargets, UntrustedConfig, check_stored_config
from project.engine.upstream import SCHEDULE_PROGRESS, SHARDS_INDEX_CLASSES, TopKCheckpoint, with_sampler

LAST = "<run dir>/checkpoints/last.ckpt"
# The longest name of a weight a line shows (a file may hold any string).
LONGEST_NAME = 120
# In a sharded checkpoint's directory (trainer=fsdp), beside DCP's files: all but the tensors, as Lightning names it.
METADATA_FILE = "meta.pt"
# The end of a checkpoint's temporary name while it is written (`being_written`).
BEING_WRITTEN = ".partial"
# DCP's index of the shards, a pickle of these classes of torch's (and torch's dtypes): what DCP itself writes there.
SHARDS_INDEX = ".metadata"
DTYPES = {name for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
# An optimizer's state in a sharded checkpoint, as Lightning names it there.
OPTIMIZER_KEY = re.compile(r"optimizer_\d+")


def is_sharded(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / METADATA_FILE).is_file()


def read_metadata(path: str | Path) -> dict[str, Any]:
    """All of a sharded checkpoint but its tensors (step, loops, data position, run config), without loading those."""
    return torch.load(Path(path) / METADATA_FILE, map_location="cpu", weights_only=True)


class ShardsIndexUnpickler(pickle.Unpickler):
    """Reads DCP's index taking only the classes DCP writes there (`SHARDS_INDEX_CLASSES`), where DCP's own
    `pickle.load` would call whatever the file names."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SHARDS_INDEX_CLASSES or (module == "torch" and name in DTYPES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}")


def is_text(value: object) -> bool:
    return isinstance(value, str)


def is_size(value: object) -> bool:
    return isinstance(value, torch.Size) and all(type(length) is int for length in value)


def index_unlike_dcps(index: Metadata) -> str | None:
    """What of DCP's index is not of the shape DCP writes, where DCP (and `check_shards`) would fail in a traceback:
    the unpickler admits DCP's classes, not what their fields hold."""
    entries, storage, paths = index.state_dict_metadata, index.storage_data, index.planner_data
    if not (isinstance(entries, dict) and all(isinstance(key, str) for key in entries)):
        return "state_dict_metadata is not a mapping of names"
    for name, entry in entries.items():
        chunks = getattr(entry, "chunks", [])
        if not isinstance(entry, (TensorStorageMetadata, BytesStorageMetadata)) or not (
            isinstance(chunks, list)
            and all(isinstance(c, ChunkStorageMetadata) and is_size(c.offsets) and is_size(c.sizes) for c in chunks)
            and (isinstance(entry, BytesStorageMetadata) or is_size(entry.size))
        ):
            return f"entry {name} is not a tensor's or a value's"
    if not (isinstance(paths, dict) and all(isinstance(part, (list, tuple)) for part in paths.values())):
        return "planner_data is not a mapping of names to their keys"
    if not isinstance(storage, dict):
        return "storage_data is not a mapping"
    for where, stored in storage.items():
        descriptors = getattr(stored, "transform_descriptors", None)
        if not (
            isinstance(where, MetadataIndex)
            and where.fqn in entries
            and isinstance(getattr(stored, "relative_path", None), str)
            and type(getattr(stored, "offset", None)) is int
            and type(getattr(stored, "length", None)) is int
            and (descriptors is None or (isinstance(descriptors, (list, tuple)) and all(map(is_text, descriptors))))
        ):
            return "storage_data holds what is not a place in a shard of one of its entries"
    return None


def check_shards(path: str | Path, key: str = "ckpt_path") -> None:
    """Refuse, before DCP reads them (unpickling its index, loading values with `weights_only=False`), a sharded
    checkpoint's files that hold more than tensors and plain values, point outside the checkpoint, or are not of
    the shape DCP reads. `key`: the config key that named it, which the line names."""
    root = Path(path).resolve()

    def refuse(what: str) -> UserError:
        return UserError(
            f"{key}={path} is a sharded checkpoint whose {what}: it is not opened (reading it would run code it "
            "names, or fail); give a checkpoint project.train wrote"
        )

    try:
        with (root / SHARDS_INDEX).open("rb") as file:
            index = ShardsIndexUnpickler(file).load()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, TypeError, ValueError) as error:
        raise refuse(f"{SHARDS_INDEX} is not DCP's index of shards ({error})") from None
    if not isinstance(index, Metadata):
        raise refuse(f"{SHARDS_INDEX} holds a {type(index).__name__}, not DCP's index of shards")
    problem = index_unlike_dcps(index)
    if problem:
        raise refuse(f"{SHARDS_INDEX} is not of the shape DCP writes ({problem})")
    for where, stored in index.storage_data.items():
        shard = (root / stored.relative_path).resolve()
        if shard.parent != root or stored.transform_descriptors:
            how = f" through {', '.join(stored.transform_descriptors)}" if stored.transform_descriptors else ""
            raise refuse(f"index reads {where.fqn} from {stored.relative_path}{how}, not plainly from its own files")
        if isinstance(index.state_dict_metadata.get(where.fqn), BytesStorageMetadata):
            with shard.open("rb") as file:
                file.seek(stored.offset)
                value = file.read(stored.length)
            try:
                torch.load(io.BytesIO(value), weights_only=True)
            except Exception as error:  # torch raises many types for what it will not load
                raise refuse(f"value {where.fqn} is more than a plain value ({error.__class__.__name__})") from None


def optimizer_state_by_index(state: object) -> dict[str, Any]:
    """An optimizer's state as DCP stores it (by parameter name) in torch's own layout: parameters numbered in the
    order of the groups, as `Optimizer.state_dict()` numbers them. ValueError where it is not one."""
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not (isinstance(groups, list) and all(isinstance(group, dict) for group in groups)):
        raise ValueError("it holds no list of param_groups")
    if not all(isinstance(group.get("params"), list) and all(map(is_text, group["params"])) for group in groups):
        raise ValueError("its param_groups are not lists of parameter names")
    names = [name for group in groups for name in group["params"]]
    number = {name: index for index, name in enumerate(names)}
    per_parameter = state.get("state", {})
    if not isinstance(per_parameter, dict) or len(number) != len(names) or not set(per_parameter) <= set(number):
        raise ValueError("its groups list a parameter twice, or its state is not by the parameters they list")
    groups = [group | {"params": [number[name] for name in group["params"]]} for group in groups]
    return {"state": {number[name]: value for name, value in per_parameter.items()}, "param_groups": groups}


def plain_checkpoint(path: str | Path, key: str = "ckpt_path") -> dict[str, Any]:
    """A sharded checkpoint as the dict of a single-file Lightning checkpoint: `state_dict` with whole tensors,
    `optimizer_states` as `Optimizer.state_dict()` gives them, and the rest from `meta.pt`."""
    check_shards(path, key)
    with tempfile.TemporaryDirectory() as scratch:
        whole = Path(scratch) / "whole.pt"
        dcp_to_torch_save(Path(path), whole)
        tensors = torch.load(whole, map_location="cpu", weights_only=True)
    optimizers = sorted((key for key in tensors if OPTIMIZER_KEY.fullmatch(key)), key=lambda key: int(key[10:]))
    try:
        if not isinstance(tensors.get("state_dict"), dict):
            raise ValueError("it holds no state_dict of weights")
        optimizer_states = [optimizer_state_by_index(tensors[key]) for key in optimizers]
    except ValueError as error:
        raise UserError(
            f"{key}={path} is a sharded checkpoint whose shards are not a module's weights and optimizer states "
            f"({error}): give a checkpoint project.train wrote"
        ) from None
    return read_metadata(path) | {"state_dict": tensors["state_dict"], "optimizer_states": optimizer_states}


def not_ours(content: object) -> str:
    """What a loaded file that is not a Lightning checkpoint holds instead, as far as it can be told."""
    if isinstance(content, dict) and content and all(isinstance(value, torch.Tensor) for value in content.values()):
        return "holds a network's weights only (a bare state_dict), not a Lightning checkpoint of a module"
    if isinstance(content, dict):
        keys = ", ".join(str(key) for key in list(content)[:6]) or "nothing"
        return f"is not a checkpoint of this project (it holds {keys}: no state_dict of a module's weights)"
    return f"is not a checkpoint of this project (it holds a {type(content).__name__}, no state_dict of weights)"


def load_lightning_checkpoint(path: str | Path, trust: TrustedTargets, tensors: bool = True) -> dict[str, Any]:
    """The Lightning checkpoint at `path` (`weights_only=True`), refused if it is not one or its stored config names a
    target `trust` does not trust. A sharded one is assembled on this process (`tensors=False`: its metadata only)."""
    path = Path(path)
    if is_sharded(path):
        metadata = read_metadata(path)
        check_stored_config(metadata.get("config"), f"ckpt_path={path}", trust)
        if tensors:
            return plain_checkpoint(path)  # which checks the shards' files before DCP reads them
        check_shards(path)  # before a resume hands the files to DCP, which would run what they name
        return metadata
    if path.is_dir():
        inside = sorted(path.glob("*.ckpt")) or sorted(path.glob("checkpoints/*.ckpt"))
        files = ", ".join(str(file) for file in inside[:3]) or "<run dir>/checkpoints/last.ckpt"
        raise UserError(f"ckpt_path={path} is a directory: give a checkpoint file ({files})")
    if not path.is_file():
        raise UserError(f"ckpt_path={path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch raises many types for a damaged or foreign file
        raise UserError(
            f"ckpt_path={path} is not a checkpoint torch.load can read (damaged, or another kind of file)"
        ) from None
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("state_dict"), dict)):
        raise UserError(
            f"ckpt_path={path} {not_ours(checkpoint)}: give a checkpoint project.train wrote ({LAST}), or one of "
            "Lightning's Trainer.save_checkpoint"
        )
    check_stored_config(checkpoint.get("config"), f"ckpt_path={path}", trust)
    return checkpoint


def checkpoint_step(path: Path) -> int:
    """The optimizer step a checkpoint (a file, or a sharded directory) was written at, its tensors left on disk."""
    if is_sharded(path):
        return read_metadata(path)["global_step"]
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)["global_step"]


def first_few(keys: Sequence[str], shown: int = 3, separator: str = ", ") -> str:
    """The first `shown` of `keys` (names read from a file), each cut to `LONGEST_NAME` characters, and how many
    more."""
    cut = [key if len(key) <= LONGEST_NAME else f"{key[: LONGEST_NAME - 3]}..." for key in keys[:shown]]
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return separator.join(cut) + more


def check_weights_fit(module: torch.nn.Module, weights: dict[str, Any], path: str | Path, advice: str) -> None:
    """Refuse in one line the weights that `module.load_state_dict(weights, strict=True)` would refuse with a
    traceback, naming the first keys missing, unexpected, and of another shape (a lazy parameter takes any)."""
    own = module.state_dict()
    reshaped = [
        f"{key} {list(weights[key].shape)} (the module's {list(value.shape)})"
        for key, value in own.items()
        if isinstance(weights.get(key), torch.Tensor)
        and isinstance(value, torch.Tensor)
        and not is_lazy(value)
        and weights[key].shape != value.shape
    ]
    found = {
        "missing": [key for key in own if key not in weights],
        "unexpected": [key for key in weights if key not in own],
        "of another shape": reshaped,
    }
    problems = [f"{kind}: {first_few(keys)}" for kind, keys in found.items() if keys]
    if problems:
        raise UserError(
            f"ckpt_path={path}: its weights do not fit {type(module).__name__} ({'; '.join(problems)}): {advice}"
        )


def what_it_trains(config: dict) -> dict:
    """What a run's weights fit: its module class and, where the module has one, its network's config (a resumed run
    may change its optimizer, schedule and data)."""
    model = config.get("model") or {}
    return {"model": model.get("_target_"), "network": model.get("network")}


def describe(trained: dict) -> str:
    network = trained["network"]
    return f"{trained['model']} with {network.get('_target_')}" if isinstance(network, dict) else str(trained["model"])


def same_data(first: dict, second: dict) -> bool:
    return (first.get("data") or {}).get("_target_") == (second.get("data") or {}).get("_target_")


def newest_last_checkpoint(outputs_dir: Path, exclude: Path, run_config: dict, trust: TrustedTargets) -> Path:
    """The newest `checkpoints/last.ckpt` under `outputs_dir`, outside `exclude`, of the same model and kind of data as
    `run_config`; one read on the way that names a target `trust` does not trust is refused, not passed over."""
    files = outputs_dir.rglob("checkpoints/last.ckpt")
    candidates = sorted(
        (path for path in files if exclude.resolve() not in path.resolve().parents),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )
    if not candidates:
        raise UserError(
            f"ckpt_path=last: no earlier run under {outputs_dir} has a checkpoints/last.ckpt; "
            "train once first, or give the checkpoint's path"
        )
    for path in candidates:
        try:
            stored = load_lightning_checkpoint(path, trust, tensors=False).get("config")
        except UntrustedConfig:
            raise
        except UserError:  # not a checkpoint of ours
            continue
        if stored and what_it_trains(stored) == what_it_trains(run_config) and same_data(stored, run_config):
            return path
    model, data = run_config["model"].get("_target_"), (run_config.get("data") or {}).get("_target_")
    raise UserError(
        f"ckpt_path=last: none of the {len(candidates)} earlier runs under {outputs_dir} trained this model "
        f"({model}) on this data ({data}); the newest, {candidates[0]}, trained another: give the checkpoint's "
        "path, or train once first"
    )


def resume_path(
    ckpt_path: str | None, run_dir: Path, outputs_dir: Path, run_config: dict, sweep_dir: Path | None = None
) -> str | None:
    """The checkpoint `trainer.fit` resumes from (`ckpt_path`: a file, "last", or null), refused where it trained
    another model than `run_config` builds; a run started again resumes from its own run dir's last.ckpt."""
    trust = TrustedTargets.of(run_config)
    own_last = run_dir / "checkpoints" / "last.ckpt"
    carried_on = sweep_dir is not None or "TORCHELASTIC_RUN_ID" in os.environ
    if carried_on and own_last.exists():  # a file, or a sharded checkpoint (a directory)
        path = own_last  # carries on from its own progress, whatever ckpt_path the launch started from
    elif ckpt_path is None:
        if not (own_last.exists() and int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0):
            return None
        # Lightning resumes by itself from its own `hpc_ckpt_*.ckpt` (written as Slurm stops the job) when newer.
        hpc_times = [path.stat().st_mtime for path in run_dir.glob("hpc_ckpt_*.ckpt")]
        return None if hpc_times and max(hpc_times) > own_last.stat().st_mtime else str(own_last)
    elif ckpt_path == "last" and own_last.exists():
        path = own_last
    elif ckpt_path == "last":  # chosen among the runs of this model and data: nothing left to check
        return str(newest_last_checkpoint(outputs_dir, sweep_dir or run_dir, run_config, trust))
    else:
        path = Path(ckpt_path)
    checkpoint = load_lightning_checkpoint(path, trust, tensors=False)
    if "config" not in checkpoint:  # a foreign checkpoint: its weights are checked against the module built
        return str(path)
    trained = what_it_trains(checkpoint["config"])
    building = what_it_trains(run_config)
    if trained != building:
        raise UserError(
            f"ckpt_path={path} holds another model ({describe(trained)}) than this run builds "
            f"({describe(building)}): resume with the checkpoint's own model and data (its run's "
            ".hydra/overrides.yaml), or train afresh (without ckpt_path; under torchrun, with a new --rdzv-id)"
        )
    return str(path)


class SeededOrder(DistributedSampler):
    """This process's share of an order drawn from `seed + epoch` alone (shuffled or not), which can start part-way.

    The order depends on the epoch number only (not on a generator that advances as iterators are made), so a
    resumed run sees the order it would have seen, and a loop that stops after the last batch (Lightning) and one that
    runs into `StopIteration` (a `for` loop) agree. With one process it is the global order the ranks of a DDP run
    share out (rank r takes samples r, r + N, ...). Being a `DistributedSampler`, Lightning leaves it in place under
    DDP instead of putting its own there; Lightning and the reference loop call `set_epoch`.
    """

    def __init__(self, dataset: Any, seed: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.skip = 0  # samples of this epoch's share already trained (a checkpoint resumed part-way)

    def start_part_way(self, epoch: int, samples_done: int) -> None:
        """Begin epoch `epoch` after the first `samples_done` samples of this process's share; later epochs whole.

        The length stays the whole share's: Lightning counts the batches already done towards the epoch's end.
        """
        self.epoch, self.skip = epoch, samples_done

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.skip = 0
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)


def batches_done(trainer: L.Trainer) -> int:
    """Batches of the current epoch trained so far (their optimizer step included)."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


def orderable(loader: object) -> bool:
    """Whether `loader` draws its order from a sampler the engine can put a `SeededOrder` in place of: torch's own
    (`ddp.torchs_own_order`), and a random one that draws each sample once (`shuffle=True`)."""
    if not torchs_own_order(loader):
        return False
    sampler = loader.sampler
    if type(sampler) is SequentialSampler:
        return True
    return not sampler.replacement and sampler.num_samples == len(loader.dataset)  # each sample once


def class_names_of(data: object, dataset: object) -> list[str] | None:
    """The names of the classes `data` (a data module) or its training `dataset` says it has (`classes` or
    `class_names`, as torchvision's datasets and the example's data modules name them), if either does."""
    while isinstance(dataset, Subset):  # `random_split`'s parts
        dataset = dataset.dataset
    for holder in (data, dataset):
        for name in ("classes", "class_names"):
            names = getattr(holder, name, None)
            if isinstance(names, (list, tuple)) and names:
                return [str(item) for item in names]
    return None


# What fixes the order a part-way position lies in, as the user sets it.
WHAT_FIXES_THE_ORDER = {
    "batch_size": "data.batch_size",
    "processes": "processes (trainer.devices × trainer.num_nodes)",
    "seed": "seed",
    "train_samples": "training samples",
}


class TrainingOrder(Callback):
    """Every run's training batches in an order a resume can continue exactly, and the data it trained on, checked.

    A data module written the plain way (`DataLoader(..., shuffle=True)`) draws each epoch's order from the global
    random state as its iterator is made, so a resumed run, whose random state is not the stopped run's, trains other
    batches; and Lightning can resume inside an epoch only where the loader can skip what was trained. So the engine
    puts a `SeededOrder` (`seed`, epoch) in place of torch's random or sequential sampler in the training loader
    (`training_loader`, through which `build.serve_through_the_engine` has the data serve it), and keeps where
    training stands in it in every checkpoint (this callback's state): a checkpoint from inside an epoch
    (`trainer.max_steps`, `trainer.max_time`, a SIGTERM, a mid-epoch one) resumes at the next batch.
    A data module that saves its own state (`state_dict`) and a sampler of its own keep their order themselves.

    The state also names the training data (its sample count and class names, where it says them), so a checkpoint
    resumed with other data (another data module of other classes, other class order or size) is refused in one line
    before training, whatever the data modules are called (Lightning keeps a data module's state under its class
    name, and gives none to another class).
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.sampler: SeededOrder | None = None  # the training loader's, once the engine has put it there
        self.batch_size = 0  # the training loader's
        self.data: dict | None = None  # the training data's size and class names, once its loader is made
        self.resumed: dict | None = None  # the state of the checkpoint this run resumes from
        self.trainer: L.Trainer | None = None

    def training_loader(self, data: Any, loader: Any) -> Any:
        """`loader` in the seeded order (when `orderable`), from where a resumed checkpoint left it; the resumed
        checkpoint's data compared with this run's first."""
        trainer = data.trainer
        self.check_same_data(data, loader)
        if keeps_its_own_place(data) or not orderable(loader):
            self.sampler = None
            return loader
        share = trainer.distributed_sampler_kwargs or {"num_replicas": 1, "rank": 0}
        shuffled = type(loader.sampler) is RandomSampler
        self.sampler = SeededOrder(loader.dataset, self.seed, share["num_replicas"], share["rank"], shuffled)
        self.batch_size = loader.batch_size
        position = (self.resumed or {}).get("position")
        if position and position["batches_done"]:
            refuse_another_order(position, self.position(position["epoch"], position["batches_done"]))
            self.sampler.start_part_way(position["epoch"], position["batches_done"] * loader.batch_size)
        return with_sampler(loader, self.sampler)

    def position(self, epoch: int, batches_done: int) -> dict[str, int]:
        sampler = self.sampler
        return {
            "epoch": epoch,
            "batches_done": batches_done,
            "batch_size": self.batch_size,
            "processes": sampler.num_replicas,
            "seed": self.seed,
            "train_samples": len(sampler.dataset),
        }

    def check_same_data(self, data: Any, loader: Any) -> None:
        """Refuse, before training, a checkpoint resumed with training data of another size or other classes (or
        classes in another order: labels are positions in that list)."""
        self.data = {"train_samples": length_of(getattr(loader, "dataset", None))}
        self.data["classes"] = class_names_of(data, getattr(loader, "dataset", None))
        stored = (self.resumed or {}).get("data")
        if not stored:
            return
        differs = [
            f"its training samples {stored['train_samples']} (this data: {self.data['train_samples']})"
            if stored["train_samples"] not in (None, self.data["train_samples"])
            else None,
            classes_unlike(stored["classes"], self.data["classes"]),
        ]
        if any(differs):
            raise UserError(
                f"ckpt_path={data.trainer.ckpt_path} trained on other data than {type(data).__name__} gives: "
                f"{'; '.join(filter(None, differs))}. Resume with the data it trained on; to train these data from its "
                "weights, start a new run (without ckpt_path)"
            )

    def state_dict(self) -> dict[str, Any]:
        """The training data's size and classes, and where training stands in the seeded order (when the engine put
        it there): Lightning's count of the batches trained in this epoch, not the loader's (it fetches one ahead)."""
        state: dict[str, Any] = {"data": self.data}
        trainer = self.trainer
        if self.sampler is not None and trainer is not None and trainer.state.fn == "fit":
            epoch, done = trainer.current_epoch, batches_done(trainer)
            if done >= trainer.num_training_batches:  # the epoch is over: the next one starts from its beginning
                epoch, done = epoch + 1, 0
            state["position"] = self.position(epoch, done)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resumed = checked_order_state(state_dict)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.trainer = trainer

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """Mark an epoch that stopped before its last batch as under way: Lightning ends the epoch when
        `trainer.max_steps` is reached (or a stop asked for inside it), then saves it as if it had ended, and the
        resumed run would skip the rest of its batches."""
        loops = checkpoint.get("loops", {}).get("fit_loop")
        if trainer.state.fn != "fit" or loops is None or math.isinf(trainer.num_training_batches):
            return
        epochs = loops["epoch_progress"]
        ended = epochs["current"]["processed"] == epochs["current"]["started"] > epochs["current"]["completed"]
        if ended and batches_done(trainer) < trainer.num_training_batches:
            for counts in (epochs["current"], epochs["total"]):
                counts["processed"] -= 1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        refuse_a_resume_the_data_cannot_continue(trainer, self.sampler is not None)


def refuse_another_order(
    stored: Mapping[str, int], now: Mapping[str, int], fixes: Mapping[str, str] = WHAT_FIXES_THE_ORDER
) -> None:
    """Refuse, in one line, to resume the part-way position `stored` in a run whose order differs (`now`): "batch 40
    of epoch 2" names other samples with another of the `fixes` (batch size, process count, seed, data), so some would
    train twice and others never. The example's data modules, which keep their own position, refuse alike."""
    changed = [f"{what} {stored[key]} (this run: {now[key]})" for key, what in fixes.items() if stored[key] != now[key]]
    if changed:
        raise UserError(
            f"ckpt_path: the checkpoint stopped part-way through epoch {stored['epoch']} (after batch "
            f"{stored['batches_done']}) of a training order this run would not follow: its "
            f"{'; its '.join(changed)}. Resume it with its own data, data.batch_size, seed and number of processes, "
            "or resume from an epoch-end checkpoint"
        )


def classes_unlike(stored: list[str] | None, now: list[str] | None) -> str | None:
    """How the class names a checkpoint trained on differ from this data's, if both name theirs and they do."""
    if stored is None or now is None or stored == now:
        return None
    if len(stored) != len(now):
        return f"its {len(stored)} classes (this data: {len(now)})"
    label = next(label for label, (there, here) in enumerate(zip(stored, now, strict=True)) if there != here)
    return f"its class {label} is {quoted(stored[label])} (in this data: {quoted(now[label])})"


def keeps_its_own_place(data: object) -> bool:
    """Whether `data` (a data module; None, or the module, under `data=none`) saves and restores where its epoch
    stands itself."""
    return isinstance(data, L.LightningDataModule) and all(
        is_overridden(hook, data, L.LightningDataModule) for hook in ("state_dict", "load_state_dict")
    )


def length_of(dataset: object) -> int | None:
    """`len(dataset)`, or None where it has none: an iterable dataset, or no dataset at all (loaders of the data's
    own making: a list or dict of them, a `CombinedLoader`)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def checked_order_state(state: object) -> dict:
    """A checkpoint's `TrainingOrder` state, refused in one line where it is not one this engine wrote: a checkpoint
    is data, and may hold anything there."""
    counts = set(WHAT_FIXES_THE_ORDER) | {"epoch", "batches_done"}
    data, position = (state.get("data"), state.get("position")) if isinstance(state, dict) else (None, None)
    problem = None
    if not isinstance(state, dict) or set(state) - {"data", "position"}:
        problem = f"holds {quoted(state)}"
    elif data is not None and not (
        isinstance(data, dict)
        and set(data) == {"train_samples", "classes"}
        and (data["train_samples"] is None or type(data["train_samples"]) is int)
        and (data["classes"] is None or (isinstance(data["classes"], list) and all(map(is_text, data["classes"]))))
    ):
        problem = f"names its data as {quoted(data)}"
    elif position is not None and not (
        isinstance(position, dict)
        and set(position) == counts
        and all(type(value) is int and value >= 0 for value in position.values())
    ):
        problem = f"holds the position {quoted(position)}"
    if problem:
        raise UserError(
            f"ckpt_path: the checkpoint's training order (its TrainingOrder state) {problem}, which is not one "
            "project.train wrote: resume from a checkpoint project.train wrote, or train afresh (without ckpt_path)"
        )
    return state


def refuse_a_resume_the_data_cannot_continue(trainer: L.Trainer, ordered_by_the_engine: bool) -> None:
    """Refuse, in one line, a resume from inside an epoch where neither the engine (`TrainingOrder`) nor the data
    module, or the module serving its own batches (`data=none`), can restore the epoch's place."""
    if trainer.ckpt_path is None or math.isinf(trainer.num_training_batches) or ordered_by_the_engine:
        return
    steps_per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
    data = trainer.datamodule
    if trainer.global_step % steps_per_epoch == 0 or keeps_its_own_place(data):
        return
    owner = type(trainer.lightning_module if data is None else data).__name__
    why = (
        f"{owner}'s training loader has a sampler of its own (or an iterable dataset), which keeps no place in an epoch"
    )
    fix = (
        "serve the training batches with torch's own samplers (DataLoader(..., shuffle=True or False)), whose order "
        "the engine keeps, or from a data module with state_dict and load_state_dict that restore where its epoch "
        "stood (see the classifier's project/example/data/classification.py)"
    )
    raise UserError(
        f"ckpt_path={trainer.ckpt_path} was written inside an epoch (step {trainer.global_step}), and {why}, so the "
        f"epoch would restart its batches: resume from a checkpoint written at an epoch's end, or {fix}"
    )


def check_checkpoint_dirs(callbacks: Sequence[Callback]) -> None:
    """Refuse, before anything trains, a checkpoint callback's dir that cannot be written (a read-only disk or mount,
    a dir without write permission): the run would otherwise fail at its first checkpoint, an epoch later."""
    for callback in callbacks:
        if not (isinstance(callback, ModelCheckpoint) and callback.dirpath):
            continue  # no dir of its own yet: Lightning puts it under the Trainer's default_root_dir
        directory = nearest_existing(Path(callback.dirpath, "checkpoint"))
        if not os.access(directory, os.W_OK):
            below = "" if directory == Path(callback.dirpath) else f" (it would be made in {directory})"
            raise UserError(
                f"the checkpoint dir {callback.dirpath}{below} cannot be written (a read-only disk, or no permission): "
                "make it writable, or write the run elsewhere (hydra.run.dir)"
            )


def refuse_a_url(path: str | Path, key: str = "ckpt_path") -> None:
    """Refuse to read a checkpoint from a URL (Lightning fetches one through torch.hub and unpickles it), which a
    restored state may name as its best checkpoint; `key` is the config key that named it."""
    if names_a_url(path):
        raise UserError(
            f"{key}={path} is a URL: checkpoints are read from local files only (a URL's content would be "
            "fetched and unpickled): download it, check it, and give the file"
        )


def deletable(path: str | Path, run_dir: str | Path) -> bool:
    """Whether Lightning may delete the checkpoint `path` (one its checkpoint callbacks replaced): only inside
    `run_dir`. One elsewhere, which only a restored state can name (another machine's file, a URL), is left as it
    is, with a warning: Lightning would delete any, recursively, through fsspec."""
    if plain_path_inside(str(path), run_dir):
        return True
    report(f"warning: {printable(str(path))} is outside this run's dir {run_dir}: not deleted", sys.stderr)
    return False


def being_written(path: Path) -> Path:
    """The temporary file beside `path` that `AtomicCheckpointIO` writes it to before renaming it into place."""
    return path.with_name(f".{path.name}{BEING_WRITTEN}")


def remove_half_written(trainer: L.Trainer) -> None:
    """Delete the checkpoints' temporary files that killed processes left where the trainer's checkpoint callbacks
    write: a SIGKILL gives `AtomicCheckpointIO` no chance to."""
    for callback in trainer.checkpoint_callbacks:
        if callback.dirpath:
            for path in Path(callback.dirpath).glob(f".*{BEING_WRITTEN}"):
                path.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file beside it and renames it into place (atomic within a directory): a
    run killed mid-write keeps the previous file whole, and a full or read-only disk is one line. Reads a checkpoint
    as data only, and deletes only the run's own (`run_dir`): Lightning asks it to read and delete the paths a
    restored callback state names."""

    def __init__(self, run_dir: str | Path) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)

    def load_checkpoint(
        self, path: str | Path, map_location: Any = "cpu", weights_only: bool | None = None
    ) -> dict[str, Any]:
        """A local file, read with `weights_only=True` whatever the caller asks (the stock reader fetches a URL and
        unpickles it), or a sharded checkpoint (trainer=fsdp) assembled on this process: a sharded run resumes under
        any strategy."""
        refuse_a_url(path)
        if is_sharded(path):
            return plain_checkpoint(path)
        return torch.load(path, map_location=map_location, weights_only=True)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete a checkpoint of this run: a file, or a sharded checkpoint's directory, never another directory."""
        path = Path(path)
        if not deletable(path, self.run_dir):
            return
        if is_sharded(path) and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_file() or path.is_symlink():
            path.unlink()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        path = Path(path)
        partial = being_written(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(checkpoint, partial)
            os.replace(partial, path)
        except BaseException as error:  # Ctrl-C and SIGTERM too: no half-written file is left behind
            with contextlib.suppress(OSError):  # a disk turned read-only: the failure to report stays the write's
                partial.unlink(missing_ok=True)
            # torch.save's RuntimeError for a full or read-only disk has no errno: the disk is asked (`disk_refuses`).
            if isinstance(error, OSError) or (isinstance(error, RuntimeError) and disk_refuses(path)):
                raise unwritable(path, getattr(error, "errno", None), str(error)) from error
            raise


class ObjectiveNotLogged(UserError):
    """The module does not log the metric a search optimises: the end of the search, not only of its trial."""

    ends_the_sweep = True


class BestCheckpoint(TopKCheckpoint):
    """`ModelCheckpoint` keeping the best `monitor`. A module that does not log it is told once, and the run goes on
    without a best checkpoint, unless its results (`results_from=best`) or a search need it."""

    def __init__(self, *args, results_from: str = "last", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.results_from = results_from
        self.told = False

    def monitor_not_logged(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        if self.told:
            return
        self.told = True
        logged = sorted(name for name in monitor_candidates if name not in ("epoch", "step"))
        module = type(trainer.lightning_module).__name__
        if logged:
            message = (
                f"optimized_metric={self.monitor} is not logged by {module} (it logs: {', '.join(logged)}): set "
                f"optimized_metric to one of those and optimized_mode=min|max, or log {self.monitor} with self.log "
                "in the module"
            )
        else:
            message = (
                f"optimized_metric={self.monitor} is not logged by {module}, which logs no metric: log one with "
                "self.log in the module and name it with optimized_metric=<name> optimized_mode=min|max"
            )
        if in_a_search():
            raise ObjectiveNotLogged(f"{message} (the search optimises it)")
        if self.results_from == "best":
            raise UserError(f"{message} (results_from=best is that metric)")
        if trainer.global_rank == 0:
            report(f"warning: {message}; no best checkpoint is kept", sys.stderr)


# What a resumed checkpoint restores besides its weights (callback, loop, optimizer and schedule states), checked
# before Lightning uses any of it: a checkpoint is data, handed around, and Lightning restores these states as they are.
#
# - Paths. A `ModelCheckpoint` deletes the files its restored state names once newer ones replace them (through fsspec,
#   recursively, any URL: `local:///home` deletes a home directory) and `results_from=best` loads its best file (a URL
#   through torch.hub, unpickled). A path a restored callback state names is kept only where it plainly lies inside
#   this run's dir (`trainer.default_root_dir`, which is `${run_dir}`): a requeued Slurm job, a carried-on sweep job or
#   `hydra.run.dir=<dir> ckpt_path=last` resume their own dir's checkpoint, whose best and last checkpoints go on being
#   kept. Any other (another run's or machine's files, a URL, `~`, `..` out of the run, a link out of it) is dropped
#   before the callback loads its state, set to the callback's fresh value, with one warning line per checkpoint.
# - Types. The loops', optimizers' and schedules' states are compared with the same states of the objects this run
#   built: what those hold must be there, and of their kind (a number where a number is); else one `error:` line,
#   exit 2, before anything trains, where Lightning would end in a traceback (or train on with a string for a rate).
# - The data module's state is its own to check (`load_state_dict`), as the example's do.

# The loop state Lightning restores for each stage (`_CheckpointConnector.restore_loops`).
LOOP_OF_STAGE = {"fit": "fit_loop", "validate": "validate_loop", "test": "test_loop", "predict": "predict_loop"}
# A ModelCheckpoint's paths, each with the score that goes with its file (dropped with it).
CHECKPOINT_PATHS = {"best_model_path": "best_model_score", "kth_best_model_path": "kth_value"}
CHECKPOINT_DIRS = ("dirpath", "last_model_path")
CHECKPOINT_SCORES = ("best_model_score", "current_score", "kth_value")
DROPPED_SHOWN = 3
# The longest dropped path a warning shows (a checkpoint may hold any string).
LONGEST_PATH = 200


def kind(fresh: object) -> str:
    """What a value must be, said from the value this run's own object holds there."""
    if isinstance(fresh, bool):
        return "True or False"
    if isinstance(fresh, Tensor):
        return "a tensor or a number"
    if isinstance(fresh, (int, float)):
        return "a number"
    return "a string" if isinstance(fresh, str) else f"a {type(fresh).__name__}"


def is_number(value: object) -> bool:
    """A real number as an optimizer or loop takes one: int, float or a one-element tensor, never a bool."""
    if isinstance(value, Tensor):
        return value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fits(stored: object, fresh: object) -> bool:
    """Whether a single `stored` value is of the kind `fresh` (this run's own) is; None there says nothing."""
    if isinstance(fresh, bool):
        return isinstance(stored, bool)
    if isinstance(fresh, Tensor):
        return isinstance(stored, Tensor) or is_number(stored)
    if isinstance(fresh, (int, float)):
        return is_number(stored)
    if isinstance(fresh, str):
        return isinstance(stored, str)
    return True


def unlike(stored: object, fresh: object, where: str, every_key: bool = True) -> str | None:
    """Where `stored` (a checkpoint's state) is not what `fresh` (the state of the object this run built) could be:
    the first key missing (where `every_key`) or of another kind, and what it holds; None where it fits. Keys only
    `stored` has, and list items beyond `fresh`'s, are left to their reader."""
    if isinstance(fresh, Mapping):
        if not isinstance(stored, Mapping):
            return f"{where} holds {quoted(stored)}, not a mapping"
        for key, value in fresh.items():
            if key not in stored:
                if every_key:
                    return f"{where} has no {quoted(key)}"
                continue
            problem = unlike(stored[key], value, f"{where}[{quoted(key)}]", every_key)
            if problem:
                return problem
        return None
    if isinstance(fresh, (list, tuple)):
        if not isinstance(stored, (list, tuple)):
            return f"{where} holds {quoted(stored)}, not a list"
        for index, (item, fresh_item) in enumerate(zip(stored, fresh, strict=False)):
            problem = unlike(item, fresh_item, f"{where}[{index}]", every_key)
            if problem:
                return problem
        return None
    return None if fits(stored, fresh) else f"{where} holds {quoted(stored)}, not {kind(fresh)}"


def refusal(path: object, problem: str) -> UserError:
    return UserError(
        f"ckpt_path={path}: {problem}, which this run's own objects cannot take: it is not a checkpoint training "
        "can go on from; resume from one project.train wrote, or train afresh (without ckpt_path)"
    )


def check_lightning_can_read(stored: Mapping, path: object, restores_optimizers: bool) -> None:
    """Refuse what Lightning and the module's hooks read before any callback sees the checkpoint (its version, to
    migrate it; the callback states' mapping; the schedules the module's `on_load_checkpoint` may take), and the
    states a resume needs that a weights-only checkpoint lacks."""
    try:
        Version(stored["pytorch-lightning_version"])
    except (KeyError, TypeError, InvalidVersion):
        version = quoted(stored.get("pytorch-lightning_version"))
        raise refusal(path, f"its pytorch-lightning_version holds {version}, not the version that wrote it") from None
    callbacks = stored.get("callbacks", {})
    if not isinstance(callbacks, Mapping) or not all(isinstance(state, Mapping) for state in callbacks.values()):
        raise refusal(path, f"its callbacks hold {quoted(callbacks)}, not a state per callback")
    needed = ("optimizer_states", "lr_schedulers") if restores_optimizers else ("lr_schedulers",)
    for key in needed:
        states = stored.get(key)
        if not isinstance(states, list) or not all(isinstance(state, Mapping) for state in states):
            what = "has none" if states is None else f"holds {quoted(states)}"
            raise refusal(path, f"its {key} {what}, not a list of states (a checkpoint of the weights alone?)")


def check_loop(checkpoint: Mapping, trainer: L.Trainer) -> None:
    """Refuse the loop state Lightning restores for this stage where it lacks a key of this run's loop, or holds
    another kind of value (Lightning would fail in a traceback, or restart a count it skipped)."""
    loops = checkpoint.get("loops")
    name = LOOP_OF_STAGE.get(trainer.state.fn)
    if loops is None or name is None:
        return  # Lightning restores no loop: a checkpoint of the weights alone
    problem = unlike(loops, {name: getattr(trainer, name).state_dict()}, "loops")
    if problem:
        raise refusal(trainer.ckpt_path, f"its {problem}")


def check_training_state(checkpoint: Mapping, trainer: L.Trainer) -> None:
    """Refuse optimizer and schedule states this run's optimizers and schedules cannot take: another count of groups
    or parameters (torch refuses with a traceback), or a value of another kind than theirs (a rate that is a string:
    torch loads it and fails at the first step). Keys only one side has are torch's to settle (an older torch's
    checkpoint lacks a newer option, which torch fills in)."""
    optimizers = zip(checkpoint.get("optimizer_states", []), trainer.optimizers, strict=False)  # as Lightning zips
    for index, (stored, optimizer) in enumerate(optimizers):
        problem = optimizer_unlike(stored, optimizer.state_dict(), f"optimizer_states[{index}]")
        if problem:
            raise refusal(trainer.ckpt_path, f"its {problem}")
    schedules = zip(checkpoint.get("lr_schedulers", []), trainer.lr_scheduler_configs, strict=False)
    for index, (stored, config) in enumerate(schedules):
        problem = unlike(stored, config.scheduler.state_dict(), f"lr_schedulers[{index}]", every_key=False)
        if problem:
            raise refusal(trainer.ckpt_path, f"its {problem}")


def optimizer_unlike(stored: object, fresh: dict, where: str) -> str | None:
    """`unlike` for an optimizer's state, with torch's own rule: as many groups, each of as many parameters."""
    if not (isinstance(stored, Mapping) and isinstance(stored.get("state"), Mapping)):
        return f"{where} holds {quoted(stored)}, not an optimizer's state and param_groups"
    groups, fresh_groups = stored.get("param_groups"), fresh["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(fresh_groups):
        return f"{where}['param_groups'] holds {quoted(groups)}, not this run's {len(fresh_groups)} group(s)"
    for index, (group, fresh_group) in enumerate(zip(groups, fresh_groups, strict=True)):
        here = f"{where}['param_groups'][{index}]"
        params = group.get("params") if isinstance(group, Mapping) else None
        if not (isinstance(params, list) and all(type(number) is int for number in params)):
            return f"{here} holds {quoted(group)}, not a group of numbered parameters"
        if len(params) != len(fresh_group["params"]):
            return f"{here} holds {len(params)} parameters, this run's group {len(fresh_group['params'])}"
        problem = unlike(group, fresh_group, here, every_key=False)
        if problem:
            return problem
    return None


def checkpoint_state_unlike(state: Mapping, where: str) -> str | None:
    """Where a ModelCheckpoint's state is not one it can take: its paths strings (or None), its scores numbers (or
    None), the two keys it always reads there."""
    for key in ("best_model_path", "best_model_score"):
        if key not in state:
            return f"{where} has no {key!r}"
    for key in (*CHECKPOINT_PATHS, *CHECKPOINT_DIRS):
        if not (state.get(key) is None or isinstance(state[key], str)):
            return f"{where}[{key!r}] holds {quoted(state[key])}, not a path"
    for key in CHECKPOINT_SCORES:
        if not (state.get(key) is None or is_number(state[key])):
            return f"{where}[{key!r}] holds {quoted(state[key])}, not a score"
    best = state.get("best_k_models", {})
    if not isinstance(best, Mapping) or not all(isinstance(p, str) and is_number(s) for p, s in best.items()):
        return f"{where}['best_k_models'] holds {quoted(best)}, not scores by path"
    return None


def names_a_path(text: str) -> bool:
    """Whether a string in a callback's state reads as a path that may lie outside the run: a URL, an absolute path,
    one of `~`, or one with a `..`. (A relative one, `val/acc`, is any callback's name for anything.)"""
    return names_a_url(text) or text.startswith(("/", "~")) or ".." in PurePath(text).parts


def drop_foreign_checkpoint_paths(state: dict, fresh: dict, inside: Callable[[str], bool], dropped: list) -> None:
    """Set each path of a ModelCheckpoint's `state` outside the run (and its file's score) to the callback's own
    `fresh` value, and leave foreign files out of its best ones; `dropped` gets each path dropped."""
    for key in (*CHECKPOINT_PATHS, *CHECKPOINT_DIRS):
        if state.get(key) and not inside(state[key]):
            dropped.append(state[key])
            state[key] = fresh[key]
            if key in CHECKPOINT_PATHS:
                state[CHECKPOINT_PATHS[key]] = fresh[CHECKPOINT_PATHS[key]]
    best = state.get("best_k_models", {})
    for path in [path for path in best if not inside(path)]:
        dropped.append(path)
        del best[path]


def without_foreign_paths(value: object, fresh: object, inside: Callable[[str], bool], dropped: list) -> object:
    """`value` (any callback's state) without the strings that read as paths outside the run, each replaced by the
    value `fresh` (the callback's own state) holds there, or left out where it holds none; `dropped` gets each."""

    def foreign(item: object) -> bool:
        return isinstance(item, str) and names_a_path(item) and not inside(item)

    if isinstance(value, Mapping):
        own = fresh if isinstance(fresh, Mapping) else {}
        kept = {}
        for key, item in value.items():
            if foreign(key) or foreign(item):
                dropped.append(key if foreign(key) else item)
                if foreign(item) and key in own:
                    kept[key] = own[key]
            else:
                kept[key] = without_foreign_paths(item, own.get(key), inside, dropped)
        return kept
    if isinstance(value, (list, tuple)):
        dropped += [item for item in value if foreign(item)]
        return type(value)(without_foreign_paths(item, None, inside, dropped) for item in value if not foreign(item))
    return value


def drop_foreign_paths(checkpoint: dict, trainer: L.Trainer) -> list[str]:
    """Drop, from the states of the trainer's callbacks in `checkpoint`, every path outside its run dir (the module
    docstring), after refusing a ModelCheckpoint state that is not one; the paths dropped, each once."""
    states = checkpoint.get("callbacks") or {}
    dropped: list[str] = []

    def inside(path: str) -> bool:
        return plain_path_inside(path, trainer.default_root_dir)

    for callback in trainer.callbacks:
        state = states.get(callback.state_key)
        if not state or isinstance(callback, TrainingOrder):
            continue  # Lightning restores none; the training order's names no file (its classes' names may read as one)
        if isinstance(callback, ModelCheckpoint):
            problem = checkpoint_state_unlike(state, f"callbacks[{type(callback).__name__}]")
            if problem:
                raise refusal(trainer.ckpt_path, f"its {problem}")
            drop_foreign_checkpoint_paths(state, callback.state_dict(), inside, dropped)
        else:
            states[callback.state_key] = without_foreign_paths(state, callback.state_dict(), inside, dropped)
    return list(dict.fromkeys(dropped))


class RestoredStateCheck(Callback):
    """Checks the checkpoint a run resumes from, and any a later stage loads (`results_from=best`), before Lightning
    restores it (the module docstring): the weights at `setup` (strictly, as the module will load them), what
    Lightning reads first there too, callback paths and the loop as each checkpoint is loaded, the optimizers and
    schedules once this run's exist, before theirs are restored."""

    def __init__(self, ckpt_path: str | None) -> None:
        self.ckpt_path = ckpt_path  # what `fit` resumes from (Lightning sets `trainer.ckpt_path` after `setup`)
        # The resumed checkpoint (its tensors mapped from disk), until this run's optimizers exist to compare with.
        self.resumed: Mapping | None = None
        # This run's optimizers' hyperparameters as configured (stored in its checkpoints), and the state of this
        # callback a resumed checkpoint stored: the hyperparameters its run configured.
        self.configured: list | None = None
        self.stored_state: object = None
        self.resuming = False
        # This run's schedules as built, and the checkpoint's states of them, compared once Lightning has restored.
        self.schedules: list[tuple[str, object]] = []
        self.stored_schedules: object = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        path = self.ckpt_path
        if stage != "fit" or path is None:
            return
        sharded = is_sharded(path)  # its optimizer states are in its shards, which DCP reads
        stored = read_metadata(path) if sharded else torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        check_lightning_can_read(stored, path, trainer.strategy.lightning_restore_optimizer and not sharded)
        self.resumed = stored
        if not sharded and pl_module.strict_loading and not is_overridden("configure_model", pl_module):
            check_resumed_weights(stored, pl_module, path)  # (a configure_model's layers do not exist yet)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """As Lightning loads a checkpoint, before any callback, loop, optimizer or schedule takes its state."""
        check_loop(checkpoint, trainer)
        dropped = drop_foreign_paths(checkpoint, trainer)
        if dropped and trainer.is_global_zero:
            shown = ", ".join(quoted(path, LONGEST_PATH) for path in dropped[:DROPPED_SHOWN])
            more = f" and {len(dropped) - DROPPED_SHOWN} more" if len(dropped) > DROPPED_SHOWN else ""
            report(
                f"warning: ckpt_path={trainer.ckpt_path}: its callback states name files outside this run's dir "
                f"{trainer.default_root_dir} ({shown}{more}), another run's or another machine's, which are not "
                "this run's: dropped, never opened or deleted; this run keeps its own best and last checkpoints "
                "from here",
                sys.stderr,
            )
        if trainer.state.fn == "fit" and not trainer.strategy.restore_checkpoint_after_setup:
            self.resumed = checkpoint  # what Lightning restores from (a sharded one assembled; Slurm's own)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """This run's optimizers and schedules exist, the checkpoint's are restored after this (a sharding strategy's
        `restore_checkpoint_after_setup`: the whole checkpoint)."""
        self.configured, self.schedules = configured_hyperparameters(trainer.optimizers), built_schedules(trainer)
        self.resuming = self.resumed is not None
        if self.resumed is not None:
            check_training_state(self.resumed, trainer)
            self.stored_schedules = self.resumed.get("lr_schedulers")
        self.resumed = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The checkpoint's optimizer and schedule states are restored, no step taken: a changed schedule is refused
        (after `ScheduleLengthCheck`, whose line says how long it is), this run's own hyperparameters go back in."""
        if not self.resuming:
            return
        refuse_a_changed_schedule(trainer, self.stored_schedules, self.schedules)
        changed = apply_configured_hyperparameters(
            trainer, self.configured, stored_configured(self.stored_state, self.configured)
        )
        if changed and trainer.is_global_zero:
            report(
                f"ckpt_path={trainer.ckpt_path}: resumed with {'; '.join(changed)}, as this run configures", sys.stderr
            )

    def state_dict(self) -> dict[str, Any]:
        return {"configured": self.configured} if self.configured is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stored_state = state_dict


def check_resumed_weights(stored: Mapping, module: L.LightningModule, path: str) -> None:
    """Refuse, before anything trains, weights the module cannot load strictly (Lightning's traceback, once `fit` has
    set up), taking them as the module's `on_load_checkpoint` passes them on (applied to a copy)."""
    if is_overridden("on_load_checkpoint", module):
        stored = {**stored, "state_dict": dict(stored["state_dict"])}
        module.on_load_checkpoint(stored)
    advice = (
        "resume with the checkpoint's own model (its run's .hydra/overrides.yaml), or train afresh (without ckpt_path)"
        if "config" in stored
        else "give the model= (and model.<key>=) that trained it, or train afresh (without ckpt_path)"
    )
    check_weights_fit(module, stored["state_dict"], path, advice)


# Starting a new run from weights (`init_from`, `init_into`, `freeze` in conf/train.yaml): fine-tuning. Only tensors
# are read, as from any checkpoint (`weights_only=True`, no URL, no stored config used); the run starts at epoch 0,
# step 0, with the optimizer and schedule its own config makes. The weights are loaded into the module as its
# constructor built it, on every process that builds it (each reads the same file), before a strategy wraps or shards
# it; DDP then broadcasts rank 0's. A weight of another shape than the module's is left at its initialisation (a head
# of another number of classes), and every such choice is said in the run's output.

# Where a weights file may keep its state_dict, the first found: a Lightning checkpoint's, and common `.pth` layouts.
STATE_DICT_KEYS = ("state_dict", "model")


def refuse_two_starts(ckpt_path: str | None, init_from: str | None) -> None:
    """Refuse a run given both a checkpoint to resume and weights to start from: resuming restores the checkpoint's
    weights over any loaded before, with its optimizer, epoch and step, so one of the two would be ignored."""
    if ckpt_path is not None and init_from is not None:
        raise UserError(
            f"ckpt_path={ckpt_path} resumes a run (its weights, optimizer, schedule, epoch and step) and "
            f"init_from={init_from} starts a new one from weights: give one of them (ckpt_path to carry a run on, "
            "init_from to fine-tune from its weights)"
        )


def tensors_in(content: object) -> dict[str, Tensor]:
    """The tensors by name of the state_dict a loaded weights file holds: under `STATE_DICT_KEYS`, or the file's
    dict itself (a bare state_dict). What is not a tensor named by a string is left out (a checkpoint's counters)."""
    if not isinstance(content, Mapping):
        return {}
    inner = next((content[key] for key in STATE_DICT_KEYS if isinstance(content.get(key), Mapping)), content)
    return {name: value for name, value in inner.items() if isinstance(name, str) and isinstance(value, Tensor)}


def weights_in_file(path: str) -> dict[str, Tensor]:
    """The weights `init_from` names, read as data: a checkpoint of this project or of Lightning (its state_dict), a
    sharded one (assembled, its files checked first), a bare state_dict (`.pth`, `.pt`), or a dict holding one."""
    refuse_a_url(path, "init_from")
    where = Path(path)
    if is_sharded(where):
        content = plain_checkpoint(where, "init_from")
    elif where.is_dir():
        raise UserError(f"init_from={path} is a directory: give a checkpoint (.ckpt) or a state_dict file (.pth, .pt)")
    elif not where.is_file():
        raise UserError(f"init_from={path}: no such file")
    else:
        try:
            content = torch.load(where, map_location="cpu", weights_only=True)
        except Exception:  # torch raises many types for a damaged, foreign or pickled-object file
            raise UserError(
                f"init_from={path} is not a file torch.load reads as data (damaged, another kind of file, or one that "
                "holds pickled objects, which are never loaded): give a checkpoint, or a state_dict saved with "
                "torch.save(module.state_dict(), path)"
            ) from None
    tensors = tensors_in(content)
    if not tensors:
        raise UserError(
            f"init_from={path} holds no tensors by name (a {type(content).__name__}, no state_dict of weights): give a "
            "checkpoint, or a state_dict saved with torch.save(module.state_dict(), path)"
        )
    return tensors


def by_submodule(loaded: Sequence[str], own: Sequence[str]) -> str:
    """How many of each top-level submodule's tensors were loaded: `backbone 2 of 2, head 0 of 2`."""
    counts: dict[str, list[int]] = {}
    taken = set(loaded)
    for name in own:
        count = counts.setdefault(name.split(".")[0], [0, 0])
        count[0] += name in taken
        count[1] += 1
    return ", ".join(f"{part} {done} of {total}" for part, (done, total) in counts.items())


def prefixed(tensors: dict[str, Tensor], module: torch.nn.Module, into: str | None) -> dict[str, Tensor]:
    """`tensors` named as `module` names them once they go into its submodule `into` (None: the module itself)."""
    if into is None:
        return tensors
    try:
        module.get_submodule(into)
    except AttributeError:
        children = ", ".join(name for name, _ in module.named_children()) or "none"
        raise UserError(
            f"init_into={into} is not a submodule of {type(module).__name__} (its submodules: {children}): give the "
            "one the file's weights belong in, or init_into=null where the file's names are the module's"
        ) from None
    return {f"{into}.{name}": tensor for name, tensor in tensors.items()}


def start_from_weights(module: torch.nn.Module, path: str | None, into: str | None, resumes: str | None) -> None:
    """Load into `module` the weights of the file `path` (`init_from`) that it has under the same name and shape
    (named `into.<name>` where `into` is given); say what was loaded and what was not. Nothing is loaded where the run
    resumes a checkpoint of its own (`resumes`: a requeued or restarted run), whose weights Lightning restores."""
    if path is None:
        return
    if resumes is not None:
        if rank_zero_only.rank == 0:
            report(f"init_from={path}: not loaded, this run resumes its own checkpoint {resumes} (its weights)")
        return
    offered = prefixed(weights_in_file(str(path)), module, into)
    own = module.state_dict()

    def fits(name: str) -> bool:
        value = own[name]
        return isinstance(value, Tensor) and (is_lazy(value) or value.shape == offered[name].shape)

    loaded = [name for name in offered if name in own and fits(name)]
    if not loaded:
        raise UserError(
            f"init_from={path}: none of its {len(offered)} tensors ({first_few(list(offered))}) is one of "
            f"{type(module).__name__}'s ({first_few(list(own))}) by name and shape: give a file of this module's "
            "weights, or init_into=<submodule> where the file's names lack the submodule's (a backbone's .pth)"
        )
    module.load_state_dict({name: offered[name] for name in loaded}, strict=False)
    if rank_zero_only.rank == 0:
        report_weights_loaded(path, module, offered, own, loaded)


def report_weights_loaded(
    path: str, module: torch.nn.Module, offered: Mapping[str, Tensor], own: Mapping[str, Any], loaded: list[str]
) -> None:
    """Say what `init_from` loaded (by submodule), and, where there are any, what it left at initialisation (of
    another shape, or not in the file) and what of the file the module did not use."""
    taken = set(loaded)
    reshaped = [
        f"{name}: file {list(offered[name].shape)}, here {list(own[name].shape)}"
        for name in offered
        if name in own and name not in taken
    ]
    missing = [name for name in own if name not in offered]
    unused = [name for name in offered if name not in own]
    report(
        f"init_from={path}: loaded {len(loaded)} of {type(module).__name__}'s {len(own)} tensors "
        f"({by_submodule(loaded, list(own))}); epoch 0, step 0, a fresh optimizer and schedule"
    )
    for what, names in (
        ("of another shape, left at initialisation", reshaped),
        ("not in the file, left at initialisation", missing),
        ("in the file, not used", unused),
    ):
        if names:
            report(f"init_from: {what}: {first_few(names, separator='; ')}")


def freeze_parameters(module: torch.nn.Module, patterns: Sequence[str] | str | None) -> None:
    """Stop training the parameters of `module` whose names match a pattern of `patterns` (fnmatch's: `backbone.*`)
    before its optimizer is made, and say how many; a pattern that matches none, or patterns that leave nothing to
    train, are refused."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
    if not patterns:
        return
    names = [name for name, _ in module.named_parameters()]
    for pattern in patterns:
        if not (isinstance(pattern, str) and any(fnmatchcase(name, pattern) for name in names)):
            raise UserError(
                f"freeze={pattern} matches none of {type(module).__name__}'s {len(names)} parameters "
                f"({first_few(names)}): give patterns of their names, such as {names[0].split('.')[0]}.*"
                if names
                else f"freeze={pattern}: {type(module).__name__} has no parameters to freeze: drop freeze"
            )
    frozen = [name for name in names if any(fnmatchcase(name, pattern) for pattern in patterns)]
    if len(frozen) == len(names):
        raise UserError(
            f"freeze={list(patterns)} freezes all {len(names)} parameters of {type(module).__name__}: nothing would "
            "train; leave out the ones to train (freeze=[backbone.*] freezes only backbone's)"
        )
    for name, parameter in module.named_parameters():
        if name in frozen:
            parameter.requires_grad_(False)
    if rank_zero_only.rank == 0:
        trained = len(names) - len(frozen)
        report(f"freeze: {len(frozen)} of {len(names)} parameters frozen ({first_few(frozen)}), {trained} train")


# A setting changed on resume (docs/checkpoints.md, "Changing a setting on resume"). Lightning restores each optimizer's
# param_groups as they were, so an lr given on the command line of a resume would be stored in the run's config and
# trained at the checkpoint's value. `RestoredStateCheck` records each group's hyperparameters as this run configured
# them (before the restore), stores them in the checkpoints it writes, and once Lightning has restored the checkpoint
# compares the two runs' configured values: one no schedule drives is applied (one line), one a schedule drives, or the
# schedule itself changed, is refused in one line before the first step.

# The param group keys a schedule writes each step: the lr, and the momentum (or Adam's first beta) that OneCycleLR
# and CyclicLR cycle where their groups hold `max_momentum`.
CYCLED_WITH_MOMENTUM = ("momentum", "betas")


def plain(value: object) -> object:
    """A param group's value as it compares and is stored: a tensor as its number(s), a tuple as a list."""
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def configured_hyperparameters(optimizers: Sequence[torch.optim.Optimizer]) -> list[list[dict[str, Any]]]:
    """Each optimizer's param groups as this run configured them (all but their parameters), plain."""
    return [[{k: plain(v) for k, v in group.items() if k != "params"} for group in o.param_groups] for o in optimizers]


def scheduled(trainer: L.Trainer) -> dict[int, str]:
    """The name of the schedule driving each optimizer that has one, by the optimizer's index."""
    names = {}
    for config in trainer.lr_scheduler_configs:
        for index, optimizer in enumerate(trainer.optimizers):
            if getattr(config.scheduler, "optimizer", None) is optimizer:
                names[index] = type(config.scheduler).__name__
    return names


def driven_by_schedule(key: str, group: Mapping, optimizer: torch.optim.Optimizer) -> bool:
    """Whether a schedule (one drives `optimizer`) sets `key` of `group`: the lr and the initial lr it starts from,
    the keys it adds of its own (`max_lr`, `base_momentum`, ...) and a cycled momentum."""
    if key in ("lr", "initial_lr") or key not in optimizer.defaults:
        return True
    return key in CYCLED_WITH_MOMENTUM and "max_momentum" in group


def where(optimizer_index: int, group_index: int, optimizers: int) -> str:
    own = f"optimizer {optimizer_index}'s " if optimizers > 1 else ""
    return f"{own}param group {group_index}"


def like(value: object, current: object) -> object:
    """A plain configured `value` as the kind of object the group holds now (a tensor, a tuple of betas)."""
    if isinstance(current, Tensor):
        return torch.as_tensor(value).to(current)
    return tuple(value) if isinstance(current, tuple) else value


def shown_value(value: object) -> str:
    """A hyperparameter's value as a line shows it (read from a checkpoint: quoted)."""
    if isinstance(value, list) and all(is_number(item) for item in value):
        return f"({', '.join(quoted(item) for item in value)})"
    return quoted(value)


def apply_configured_hyperparameters(trainer: L.Trainer, now: list, then: list | None) -> list[str]:
    """Set, after Lightning's restore, each hyperparameter this run configures otherwise than the checkpoint's run
    (`then`: its configured values, or None where its checkpoint stores none: then the restored ones, less what a
    schedule moves) to this run's value; what was changed, said. A changed one that a schedule drives is refused."""
    optimizers, schedules, changed = trainer.optimizers, scheduled(trainer), []
    for o, optimizer in enumerate(optimizers):
        for g, group in enumerate(optimizer.param_groups):
            stored = then[o][g] if then is not None else {k: plain(v) for k, v in group.items() if k != "params"}
            # initial_lr first: under a schedule it is the lr as configured, which `lr` is not once stepped.
            for key in sorted(now[o][g], key=lambda name: name != "initial_lr"):
                value = now[o][g][key]
                if not isinstance(stored, Mapping) or key not in stored or stored[key] == value:
                    continue
                driven = o in schedules and driven_by_schedule(key, group, optimizer)
                if driven and then is None and key in ("lr", *CYCLED_WITH_MOMENTUM):
                    continue  # moved by the schedule as it ran: without the configured value, nothing to compare
                place, name = where(o, g, len(optimizers)), "lr" if key == "initial_lr" else key
                if driven:
                    raise UserError(
                        f"ckpt_path={trainer.ckpt_path}: this run configures {name} {shown_value(value)} for {place}, "
                        f"the checkpoint's run {shown_value(stored[key])}, and its learning-rate schedule "
                        f"({schedules[o]}) "
                        f"drives {name} from there: a schedule cannot start again from another {name} midway (its "
                        f"steps so far were taken from the old one); resume with the checkpoint's {name}, or start a "
                        "new run without ckpt_path"
                    )
                trained_at = shown_value(group[key])
                changed.append(f"{name} {shown_value(value)} for {place} (the checkpoint trained at {trained_at})")
                group[key] = like(value, group[key])
    return changed


def schedule_settings(state: object) -> object:
    """A schedule's state without what changes as it steps, at any depth (SequentialLR holds its parts' states)."""
    if isinstance(state, Mapping):
        return {key: schedule_settings(value) for key, value in state.items() if key not in SCHEDULE_PROGRESS}
    if isinstance(state, (list, tuple)):
        return [schedule_settings(item) for item in state]
    return plain(state)


def built_schedules(trainer: L.Trainer) -> list[tuple[str, object]]:
    """Each of this run's schedules as built, before Lightning loads the checkpoint's state into it: its class's
    name and its settings."""
    return [
        (type(c.scheduler).__name__, schedule_settings(c.scheduler.state_dict())) for c in trainer.lr_scheduler_configs
    ]


def changed_schedule(stored_states: object, built: list[tuple[str, object]]) -> str | None:
    """How this run's schedules, as built, differ from the checkpoint's, which Lightning loads into them as they are
    (another class's attributes too): another count, class, or argument (its own before what it derives from them)."""
    stored_states = stored_states if isinstance(stored_states, list) else []
    if len(stored_states) != len(built):
        return f"the checkpoint's run had {len(stored_states)} learning-rate schedule(s), this run has {len(built)}"
    for index, (stored, (name, fresh)) in enumerate(zip(stored_states, built, strict=True)):
        stored = schedule_settings(stored)
        if not isinstance(stored, Mapping) or set(stored) != set(fresh):
            return f"the checkpoint's learning-rate schedule {index} is not a {name}, as this run's is"
        for key in sorted((key for key in fresh if stored[key] != fresh[key]), key=lambda key: (key[0] == "_", key)):
            return (
                f"the checkpoint's learning-rate schedule {index} ({name}) was built with "
                f"{key}={shown_value(stored[key])}, this run's with {key}={shown_value(fresh[key])}"
            )
    return None


def refuse_a_changed_schedule(trainer: L.Trainer, stored_states: object, built: list[tuple[str, object]]) -> None:
    problem = changed_schedule(stored_states, built)
    if problem:
        raise UserError(
            f"ckpt_path={trainer.ckpt_path}: {problem}, and Lightning has loaded the checkpoint's schedule into this "
            "run's as it is (its settings over this run's): resume with the checkpoint's schedule, or start a new run "
            "without ckpt_path"
        )


def stored_configured(state: object, now: list) -> list | None:
    """The checkpoint's run's configured hyperparameters from this callback's stored state, where they are of this
    run's optimizers and groups (a checkpoint is data); None where there are none to compare."""
    configured = state.get("configured") if isinstance(state, Mapping) else None
    if not (isinstance(configured, list) and len(configured) == len(now)):
        return None
    for stored, fresh in zip(configured, now, strict=True):
        if not (isinstance(stored, list) and len(stored) == len(fresh) and all(isinstance(g, Mapping) for g in stored)):
            return None
    return [[{key: plain(value) for key, value in group.items()} for group in groups] for groups in configured]
