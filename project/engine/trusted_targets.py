"""Which `_target_`s a config read from disk (a checkpoint's) may name: those a config file here or the run's own
config names, and what `trusted_targets` trusts; anything else is refused before its first import. On Hydra 1.4 the
same list is Hydra's execution whitelist."""

import functools
import importlib
import importlib.resources
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from project.engine.config import switched_on
from project.engine.errors import UserError
from project.engine.upstream import defined_name, execution_whitelist, located

TARGET_KEY = "_target_"
# The engine's targets that a checkpoint of an earlier version of the template stores under their old name.
MOVED_TARGETS = {
    "project.engine.best_checkpoint.BestCheckpoint": "project.engine.checkpoints.BestCheckpoint",
    "project.engine.progress.progress_bar": "project.engine.reports.progress_bar",
}


class UntrustedConfig(UserError):
    """A config read from disk that names a target this run does not trust (or holds an interpolation)."""


@dataclass(frozen=True)
class TrustedTargets:
    """What a config read from disk may name: `composed`, the run's own config's targets; `named`, with the config
    files' (read when first needed); `patterns`, the values of `trusted_targets` (exact names, or `<package>.*`)."""

    composed: frozenset[str]
    patterns: tuple[str, ...]

    @classmethod
    def of(cls, config: dict) -> "TrustedTargets":
        """What the run whose resolved config is `config` trusts."""
        given = config.get("trusted_targets") or {}
        if not isinstance(given, dict) or not all(isinstance(value, str) or value is None for value in given.values()):
            raise UserError(
                f"trusted_targets must map names to targets (<package>.* or a full name), got {given}: e.g. "
                "+trusted_targets.mine=my_project.*"
            )
        patterns = tuple(value for value in given.values() if value is not None)  # null switches a default off
        return cls(frozenset(targets_in(config)), patterns)

    @functools.cached_property
    def named(self) -> frozenset[str]:
        return self.composed | named_in_config_files()

    def trusts(self, target: str) -> bool:
        """Whether `target` may be imported and called: named, or a class or a module's function defined under a
        `<package>.*` pattern (imported to tell)."""
        if target in self.composed or target in self.patterns or target in self.named:
            return True
        if not self.under_a_pattern(target):
            return False
        found = located(target)
        if found is None:  # nothing there to run: instantiate reports it as it would any missing target
            return True
        defined_here = inspect.isclass(found) or (inspect.isfunction(found) and "." not in found.__qualname__)
        return defined_here and self.under_a_pattern(defined_name(found))

    def under_a_pattern(self, name: str) -> bool:
        return any(name.startswith(pattern[:-1]) for pattern in self.patterns if pattern.endswith(".*"))

    def as_whitelist(self) -> list[str]:
        """The same list in the form of Hydra 1.4's execution whitelist."""
        return sorted(self.named) + list(self.patterns)


def composed_targets(node: DictConfig) -> Callable[[], list[str]]:
    """The targets a node of the composed config names (the user chose them), when asked."""
    return lambda: sorted(set(targets_in(OmegaConf.to_container(node, resolve=True))))


def job_whitelist(cfg: DictConfig) -> list[str]:
    """Hydra 1.4's whitelist for a job built from the composed `cfg`: the targets of `cfg` and of its Hydra config,
    and `trusted_targets`."""
    hydra_node = OmegaConf.to_container(HydraConfig.get(), resolve=False) if HydraConfig.initialized() else {}
    config = OmegaConf.to_container(cfg, resolve=True)
    # A callback switched off (`enabled: false`) is never built: its target is not listed, nor imported to be.
    if isinstance(config.get("callbacks"), dict):
        callbacks = config["callbacks"].items()
        config["callbacks"] = {
            name: node for name, node in callbacks if not isinstance(node, dict) or switched_on(node)
        }
    trust = TrustedTargets.of(config)
    return sorted(trust.composed | set(targets_in(hydra_node))) + list(trust.patterns)


def trusted_targets(cfg: DictConfig) -> TrustedTargets:
    """What `cfg`'s run trusts: its own targets, its config files', and `cfg.trusted_targets`."""
    return TrustedTargets.of(OmegaConf.to_container(cfg, resolve=True))


def named_in_config_files() -> frozenset[str]:
    """Every `_target_` the YAML files on this run's search path name as plain text (not by `${...}`)."""
    found: set[str] = set()
    for text in config_file_texts():
        try:
            content = yaml.safe_load(text)
        except yaml.YAMLError:  # not a config this run can compose either; Hydra says so where one is used
            continue
        found.update(target for target in targets_in(content) if isinstance(target, str) and "${" not in target)
    return frozenset(found)


def config_sources() -> list[tuple[str, str]]:
    """(scheme, path) of each config source of this run: from its Hydra config, or else Hydra's compose API's loader."""
    if HydraConfig.initialized():
        return [(source.schema, source.path) for source in HydraConfig.get().runtime.config_sources]
    if GlobalHydra.instance().is_initialized():
        return [(source.scheme(), source.path) for source in GlobalHydra.instance().config_loader().get_sources()]
    return []


def config_file_texts() -> Iterator[str]:
    """The text of every YAML file of this run's config sources, directories and packages."""
    for scheme, path in config_sources():
        if scheme == "file" and Path(path).is_dir():
            yield from (file.read_text() for file in sorted(Path(path).rglob("*.yaml")))
        elif scheme == "pkg":
            try:
                yield from yaml_texts(importlib.resources.files(path))
            except (ModuleNotFoundError, TypeError):  # a package that is not there: Hydra warns of it itself
                continue


def yaml_texts(folder: Any) -> Iterator[str]:
    """The YAML files' texts in a package's folder (an `importlib.resources` Traversable), and below."""
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from yaml_texts(entry)
        elif entry.name.endswith(".yaml"):
            yield entry.read_text()


def targets_in(node: Any) -> Iterator[str]:
    """The `_target_` values of a plain config (dicts and lists), at any depth."""
    return (target for _, target in target_keys(node))


def target_keys(node: Any) -> Iterator[tuple[str, Any]]:
    """(key, value) of every `_target_` of a plain config, keys dotted from the root (`model.network._target_`)."""
    return ((key, value) for key, value in entries(node) if key.rsplit(".", 1)[-1] == TARGET_KEY)


def entries(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every entry of a plain config's dicts and lists, at any depth, parents first."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for name, value in children:
        where = f"{key}[{name}]" if isinstance(node, list) else f"{key}.{name}" if key else str(name)
        yield where, value
        yield from entries(value, where)


def check_stored_config(config: Any, source: str, trust: TrustedTargets) -> None:
    """Refuse, in one line, a config read from `source` (a checkpoint) that names a target `trust` does not trust, or
    holds an interpolation (a resolver acts as it resolves)."""
    interpolated = next(((k, v) for k, v in entries(config) if isinstance(v, str) and "${" in v), None)
    if interpolated is not None:
        key, value = interpolated
        raise UntrustedConfig(
            f"{source}: its stored config holds {key}={value}, an interpolation, which the project never stores (it "
            "stores its configs resolved) and which could act as it resolves: it is not opened; use a checkpoint "
            "project.train wrote"
        )
    for key, target in target_keys(config):
        if not isinstance(target, str) or not trust.trusts(MOVED_TARGETS.get(target, target)):
            label = str(target).split(".")[0] or "mine"
            raise UntrustedConfig(
                f"{source}: its stored config names {key}={target}, which no config file here names and "
                f"trusted_targets does not trust, so it is neither imported nor run: if you trust that code, add "
                f"+trusted_targets.{label}={target} (or give the config dir that names it, "
                "'hydra.searchpath=[file://<dir>]')"
            )


def trusted_instantiation(trust: TrustedTargets) -> AbstractContextManager:
    """On Hydra 1.4, `trust` as the whitelist for every `instantiate` inside; nothing on Hydra 1.3."""
    return execution_whitelist(trust.as_whitelist)
