"""A trained run rebuilt from its checkpoint for `project.evaluate` and `project.predict` (from its stored config, or
the command line's for a foreign one), and its predictions gathered per output into files."""

import csv
import functools
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.modules.module
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from project.engine.build import instantiate_group
from project.engine.checkpoints import LAST, check_weights_fit, load_lightning_checkpoint
from project.engine.errors import CONSTRUCTOR_ERRORS, UserError, find_user_error
from project.engine.run_log import printable
from project.engine.trusted_targets import Confinement, trusted_instantiation, trusted_targets

Outputs = dict[str, Tensor]
# What `OmegaConf.select` gives for a key a config lacks (None may be a value).
MISSING_KEY = object()
DEFAULT_PREDICT_STEP = L.LightningModule.predict_step.__code__
# Where torch's `Module.__call__` runs, between the default predict_step and the module's forward.
MODULE_CALL_FILE = torch.nn.modules.module.__file__


def rebuild_trained(cfg: DictConfig, program: str) -> tuple[Any, Any]:
    """(datamodule or None for `data=none`, module with the trained weights) of `cfg.ckpt_path`, from its stored
    config or a foreign checkpoint's command line; the data module gets its state back, to refuse other data."""
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise UserError(f"give the checkpoint: python -m {program} ckpt_path=<run dir>/checkpoints/last.ckpt")
    trust = trusted_targets(cfg)
    checkpoint = load_lightning_checkpoint(cfg.ckpt_path, trust)
    with trusted_instantiation(trust):
        if "config" in checkpoint:
            confinement = confinement_of(cfg)
            with confinement:
                datamodule, module = rebuild_from_stored_config(cfg, checkpoint["config"])
            for built in (datamodule, module):
                prepares_within(confinement, built)
            advice = "use it with the version of the project that trained it"
        else:
            datamodule, module = build_from_command_line(cfg)
            advice = "give the model= (and model.<key>=) that trained it"
    check_weights_fit(module, checkpoint["state_dict"], cfg.ckpt_path, advice)
    module.load_state_dict(checkpoint["state_dict"], strict=True)
    data_state = checkpoint.get(type(datamodule).__qualname__) if datamodule is not None else None
    if data_state is not None:
        datamodule.load_state_dict(data_state)
    return datamodule, module


def confinement_of(cfg: DictConfig) -> Confinement:
    """What building `cfg.ckpt_path`'s stored config may do: write in this run's dir and in the dirs the command
    line's `data.<key>=` name (`data.root`: where the data is to be put), connect out only for `data.download=true`
    given there."""
    given = data_given(cfg)
    run_dir = OmegaConf.select(HydraConfig.get(), "runtime.output_dir") if HydraConfig.initialized() else None
    named = [value for value in given.values() if isinstance(value, str)]
    return Confinement(
        source=f"ckpt_path={cfg.ckpt_path}",
        writable=tuple(Path(os.path.realpath(path)) for path in [run_dir, *named] if path),
        may_connect=given.get("download") is True,
        fix=(
            "where its data is to be written (unpacked, downloaded), give that dir as data.root=<dir>, and "
            "data.download=true to let it download; otherwise use a checkpoint you trust"
        ),
    )


def prepares_within(confinement: Confinement, built: Any) -> None:
    """`built`'s `prepare_data` and `setup` (where it has them: a data module, a module), which Lightning calls as the
    run starts, run inside `confinement` too: they are where a data module fetches and unpacks its files."""
    for hook in ("prepare_data", "setup"):
        method = getattr(built, hook, None)
        if callable(method):
            setattr(built, hook, confined_call(confinement, method))


def confined_call(confinement: Confinement, method: Any) -> Any:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with confinement:
            return method(*args, **kwargs)

    return call


def rebuild_from_stored_config(cfg: DictConfig, config: dict) -> tuple[Any, Any]:
    """(datamodule, module) as the run stored in the checkpoint built them, with the `data.<key>=` given; a
    `model=`/`data=` choice is refused, as the stored config would silently win over it."""
    given = [f"{group}=" for group in ("model", "data") if chosen(cfg, group)]
    if given:
        raise UserError(
            f"ckpt_path={cfg.ckpt_path} stores the config of the run that wrote it, which rebuilds its model and "
            f"data: leave out {' and '.join(given)} (data.<key>= changes a key of its data, e.g. data.root=<dir>)"
        )
    data_overrides = data_given(cfg)
    trained = OmegaConf.create(config)
    lacking = [group for group in ("data", "model") if not isinstance(trained.get(group), DictConfig)]
    if lacking:
        raise UserError(
            f"ckpt_path={cfg.ckpt_path}: its stored config has no {lacking[0]} to rebuild: give a checkpoint "
            f"project.train wrote ({LAST}), which stores the whole config"
        )
    unknown = sorted(set(data_overrides) - set(trained.data))
    if unknown and not trained.data:
        raise UserError(
            f"data.{unknown[0]}: the run of ckpt_path={cfg.ckpt_path} had no data module (data=none), its module "
            "serving its own batches: leave out data.<key>="
        )
    if unknown:
        keys = ", ".join(key for key in trained.data if not key.startswith("_"))
        raise UserError(
            f"data.{unknown[0]}: the checkpoint's data ({trained.data._target_}) has no such key; it has {keys}"
        )
    trained.model = with_model_given(cfg, trained.model)
    try:
        datamodule = instantiate(trained.data, **data_overrides) if trained.data else None  # None: data=none
        return datamodule, instantiate(trained.model)
    except CONSTRUCTOR_ERRORS as error:
        if find_user_error(error):  # the user's own mistake, already worded (e.g. data that is missing)
            raise
        moved = missing_file_given_by(error, cfg, OmegaConf.to_container(trained))
        if moved:
            raise moved from None
        raise UserError(
            f"{cfg.ckpt_path}: its stored config no longer builds with this version of the project ({error}); "
            f"use it with the version that trained it"
        ) from None


def with_model_given(cfg: DictConfig, model: DictConfig) -> DictConfig:
    """The checkpoint's model config with the `+model.<key>=` values given on the command line (a file its
    constructor reads that has moved), each a key it has; a `_target_` given there is the user's own name, trusted as
    any the command line names."""
    given = OmegaConf.to_container(cfg.model) if isinstance(cfg.get("model"), DictConfig) else {}
    for key, _ in leaves(given):
        if OmegaConf.select(model, key, default=MISSING_KEY) is MISSING_KEY:
            keys = ", ".join(name for name in model if not name.startswith("_"))
            raise UserError(
                f"model.{key}: the checkpoint's model ({model.get('_target_')}) has no such key; it has {keys}"
            )
    return OmegaConf.merge(model, given) if given else model


def leaves(node: object, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of each value of a nested mapping that is not a mapping."""
    if not isinstance(node, dict):
        return [(prefix, node)]
    found = []
    for key, value in node.items():
        found += leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def missing_file_given_by(error: BaseException, cfg: DictConfig, config: dict) -> UserError | None:
    """Where building the stored config failed on a file that is not there, and a key of its model or data holds
    that path (a file moved since it trained): one line naming the key and how to point it elsewhere."""
    while error is not None and not (isinstance(error, FileNotFoundError) and error.filename):
        error = error.__cause__ or error.__context__
    if error is None:
        return None
    for group in ("model", "data"):
        for key, value in leaves(config.get(group) or {}):
            if isinstance(value, str) and value == str(error.filename):
                plus = "" if group == "data" and key in (cfg.get("data") or {}) else "+"
                return UserError(
                    f"ckpt_path={cfg.ckpt_path}: its stored {group}.{key}={printable(str(error.filename))}: no such "
                    f"file (moved, or trained on another machine): give {plus}{group}.{key}=<where it is now>"
                )
    return None


def build_from_command_line(cfg: DictConfig) -> tuple[Any, Any]:
    """(datamodule, module) of `model=`/`data=` and their keys, for a checkpoint that stores no config; the root
    config's `data.<key>` slots left null are dropped, so a data module is not given an argument it may not take."""
    lacking = [f"{group}=<option>" for group in ("model", "data") if not chosen(cfg, group)]
    if lacking:
        raise UserError(
            f"ckpt_path={cfg.ckpt_path} is a Lightning checkpoint this project did not write (it holds weights, a "
            "state_dict, but no config to rebuild its module and data from): give "
            f"{' and '.join(lacking)} (and their keys) as project.train would take them to train it"
        )
    data = {key: value for key, value in OmegaConf.to_container(cfg.data, resolve=True).items() if value is not None}
    return instantiate_group("data", OmegaConf.create(data)), instantiate_group("model", cfg.model)


def data_given(cfg: DictConfig) -> dict[str, Any]:
    """The `data.<key>=` values given on the command line (not null), which replace the checkpoint's; none where
    `data=<option>` chose a data config (a foreign checkpoint's)."""
    if "data" not in cfg or chosen(cfg, "data"):
        return {}
    return {key: value for key, value in OmegaConf.to_container(cfg.data).items() if value is not None}


def chosen(cfg: DictConfig, group: str) -> bool:
    """Whether the command line chose a config of `group` (`model=toy`): one that names its class."""
    return isinstance(cfg.get(group), DictConfig) and "_target_" in cfg[group]


@contextmanager
def blamed_on_data_given(cfg: DictConfig) -> Iterator[None]:
    """A network that fails on data changed by `data.<key>=` (`data.image_size`) was given samples of another shape
    than it was trained on: one line naming those keys. Without such keys the traceback is kept."""
    given = data_given(cfg)
    try:
        yield
    except RuntimeError as error:
        if not given or find_user_error(error):
            raise
        keys = " ".join(f"data.{key}={value}" for key, value in given.items())
        raise UserError(
            f"the checkpoint's network does not take the samples of the data as given ({keys}): "
            f"{' '.join(str(error).split())}; change only where the data is and how it is read (data.root, "
            "data.batch_size), not what its samples are"
        ) from None


@contextmanager
def predict_step_needed(module: L.LightningModule) -> Iterator[None]:
    """Run a prediction of `module`; its forward refusing the batch of the default predict_step is one line (any
    other TypeError, a fault inside forward included, keeps its traceback)."""
    try:
        yield
    except TypeError as error:
        if not forward_refused_the_batch(error, module):
            raise
        raise UserError(
            f"{type(module).__name__} defines no predict_step, and Lightning's default one calls its forward with the "
            f"whole batch, which it does not take ({' '.join(str(error).split())}): define "
            "predict_step(self, batch, batch_idx) in the module, returning its predictions"
        ) from None


def forward_refused_the_batch(error: TypeError, module: L.LightningModule) -> bool:
    """Whether `error` is the module's `forward` refusing, at the call, the whole batch Lightning's default
    `predict_step` gave it: no frame after that predict_step's is anything but torch's call of a module."""
    if is_overridden("predict_step", module):
        return False
    codes = [frame.f_code for frame, _ in traceback.walk_tb(error.__traceback__)]
    if DEFAULT_PREDICT_STEP not in codes:
        return False
    return all(code.co_filename == MODULE_CALL_FILE for code in codes[codes.index(DEFAULT_PREDICT_STEP) + 1 :])


def named(batch_output: object) -> Outputs:
    """One batch's outputs by name."""
    if isinstance(batch_output, dict):
        outputs = {str(key): value for key, value in batch_output.items()}
    elif isinstance(batch_output, (tuple, list)):
        outputs = {str(index): value for index, value in enumerate(batch_output)}
    else:
        outputs = {"output": batch_output}
    for name, value in outputs.items():
        if not (isinstance(value, Tensor) and value.ndim > 0):
            raise UserError(
                f"predict_step returned {type(value).__name__} as its output {name!r}: project.predict writes "
                "tensors with a row per sample (a tensor, or a tuple, list or dict of them)"
            )
    return outputs


def joined(batches: list[object]) -> Outputs:
    """Every batch's outputs, joined along the samples; a batch whose outputs are named otherwise than the first's
    has no place in the same columns."""
    per_batch = [named(batch) for batch in batches]
    if not per_batch:
        return {}
    first = per_batch[0]
    for index, outputs in enumerate(per_batch[1:], start=1):
        if outputs.keys() != first.keys():  # compared as sets: the same outputs in another order are the same
            raise UserError(
                f"predict_step returned outputs {list(first)} for batch 0 and {list(outputs)} for batch {index}: "
                "project.predict joins each output over the batches, so return the same outputs for every batch"
            )
    return {name: torch.cat([outputs[name].detach().cpu() for outputs in per_batch]) for name in first}


def interleave(shares: list[Outputs]) -> Outputs:
    """The ranks' shares back in the split's order: rank r holds samples r, r + N, r + 2N, ..."""
    ranks = len(shares)
    result = {}
    for name, first in shares[0].items():
        total = sum(len(share[name]) for share in shares)
        joined_output = torch.empty((total, *first.shape[1:]), dtype=first.dtype)
        for rank, share in enumerate(shares):
            joined_output[rank::ranks] = share[name]
        result[name] = joined_output
    return result


def write_table(outputs: Outputs, path: Path) -> bool:
    """One CSV row per sample (`index`, then a column per value) where every output is 1-D or 2-D; whether it did."""
    if not outputs or any(output.ndim > 2 for output in outputs.values()):
        return False
    columns: list[str] = []
    values: list[Tensor] = []
    for name, output in outputs.items():
        matrix = output.reshape(len(output), -1)
        columns += [name] if matrix.shape[1] == 1 else [f"{name}_{index}" for index in range(matrix.shape[1])]
        values.append(matrix)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["index", *columns])
        rows = zip(*(matrix.tolist() for matrix in values), strict=True)
        for index, parts in enumerate(rows):
            writer.writerow([index, *(value for part in parts for value in part)])
    return True
