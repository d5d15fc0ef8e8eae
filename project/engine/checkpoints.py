"""Checkpoints: which one a run resumes from; refusing files that are not Lightning checkpoints, weights that do not fit
and resumes the data cannot carry on; writing them whole; and keeping the best one (`BestCheckpoint`)."""

import contextlib
import io
import math
import os
import pickle
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.model_helpers import is_overridden
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

from project.engine.errors import UserError, disk_refuses, escaped, nearest_existing, unwritable
from project.engine.run_dir import names_a_url, plain_path_inside
from project.engine.run_log import report
from project.engine.sweeps import in_a_search
from project.engine.trusted_targets import TrustedTargets, UntrustedConfig, check_stored_config
from project.engine.upstream import SHARDS_INDEX_CLASSES, TopKCheckpoint

LAST = "<run dir>/checkpoints/last.ckpt"
# In a sharded checkpoint's directory (trainer=fsdp), beside DCP's files: all but the tensors, as Lightning names it.
METADATA_FILE = "meta.pt"
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


def check_shards(path: str | Path) -> None:
    """Refuse, before DCP reads them (unpickling its index, loading values with `weights_only=False`), a sharded
    checkpoint's files that hold more than tensors and plain values, point outside the checkpoint, or are not of
    the shape DCP reads."""
    root = Path(path).resolve()

    def refuse(what: str) -> UserError:
        return UserError(
            f"ckpt_path={path} is a sharded checkpoint whose {what}: it is not opened (reading it would run code it "
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


def plain_checkpoint(path: str | Path) -> dict[str, Any]:
    """A sharded checkpoint as the dict of a single-file Lightning checkpoint: `state_dict` with whole tensors,
    `optimizer_states` as `Optimizer.state_dict()` gives them, and the rest from `meta.pt`."""
    check_shards(path)
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
            f"ckpt_path={path} is a sharded checkpoint whose shards are not a module's weights and optimizer states "
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


def first_few(keys: list[str], shown: int = 3) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


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


def refuse_a_resume_the_data_cannot_continue(trainer: L.Trainer) -> None:
    """Refuse, in one line, a resume from inside an epoch where the data module, or the module serving its own batches
    (`data=none`), cannot restore the epoch's place."""
    if trainer.ckpt_path is None or math.isinf(trainer.num_training_batches):
        return
    steps_per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
    data = trainer.datamodule
    keeps_its_position = all(
        is_overridden(hook, data, L.LightningDataModule) for hook in ("state_dict", "load_state_dict")
    )
    if trainer.global_step % steps_per_epoch == 0 or keeps_its_position:  # None (data=none) overrides nothing
        return
    if data is None:
        why = f"{type(trainer.lightning_module).__name__} serves its own batches (data=none), which keep no place"
        fix = "serve the data from a data module with state_dict and load_state_dict"
    else:
        why = (
            f"{type(data).__name__} cannot say where in an epoch its data stood (it defines no "
            "state_dict/load_state_dict)"
        )
        fix = "give the data module state_dict and load_state_dict"
    raise UserError(
        f"ckpt_path={trainer.ckpt_path} was written inside an epoch (step {trainer.global_step}), and {why}, so the "
        f"epoch would restart its batches: resume from a checkpoint written at an epoch's end, or {fix} (see the "
        "classifier's project/example/data/classification.py)"
    )


class PartWayResumeCheck(Callback):
    """Refuses, before the first step, a resume from inside an epoch whose data cannot restore where the epoch stood:
    it would start the epoch's batches again while Lightning counts on from the saved step."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        refuse_a_resume_the_data_cannot_continue(trainer)


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


def refuse_a_url(path: str | Path) -> None:
    """Refuse to read a checkpoint from a URL (Lightning fetches one through torch.hub and unpickles it), which a
    restored state may name as its best checkpoint."""
    if names_a_url(path):
        raise UserError(
            f"ckpt_path={path} is a URL: checkpoints are read from local files only (a URL's content would be "
            "fetched and unpickled): download it, check it, and give the file"
        )


def deletable(path: str | Path, run_dir: str | Path) -> bool:
    """Whether Lightning may delete the checkpoint `path` (one its checkpoint callbacks replaced): only inside
    `run_dir`. One elsewhere, which only a restored state can name (another machine's file, a URL), is left as it
    is, with a warning: Lightning would delete any, recursively, through fsspec."""
    if plain_path_inside(str(path), run_dir):
        return True
    report(f"warning: {escaped(str(path))} is outside this run's dir {run_dir}: not deleted", sys.stderr)
    return False


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
        partial = path.with_name(f".{path.name}.partial")
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
