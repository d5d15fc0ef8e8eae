"""A config read from disk (a checkpoint's) is data: plain values only; the `_target_`s of what is rebuilt from it
(its `model` and `data`) named exactly by a config file here, the run's own config or `trusted_targets`, anything else
refused before its first import; and what those targets do as they are built confined to the run (`Confinement`). On
Hydra 1.4 the same list is Hydra's execution whitelist."""

import functools
import importlib
import importlib.resources
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
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
# What a stored config may hold: the values of JSON (and of YAML as the project writes it), nothing else.
PLAIN_TYPES = (dict, list, str, int, float, bool, type(None))
# The parts of a stored config that project.evaluate and project.predict rebuild: the same network and data. The rest
# (trainer, callbacks, loggers, paths) is a record of the run, never read back: those come from the user's config.
REBUILT = ("model", "data")
# A target Hydra can locate: a dotted Python name.
DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", re.ASCII)
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
        """What the run whose resolved config is `config` trusts: each value of `trusted_targets` a name or a list of
        names (null switches a default off)."""
        given = config.get("trusted_targets") or {}
        values = given.values() if isinstance(given, dict) else [given]
        listed = [value if isinstance(value, list) else [value] for value in values if value is not None]
        if not isinstance(given, dict) or not all(isinstance(name, str) for names in listed for name in names):
            raise UserError(
                f"trusted_targets must map names to targets (a full name, a list of them, or <package>.*), got "
                f"{given}: e.g. +trusted_targets.mine=my_project.MyModule"
            )
        return cls(frozenset(targets_in(config)), tuple(name for names in listed for name in names))

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


def not_plain(config: Any) -> str | None:
    """Where `config` first holds what plain data does not (a tuple, a set, bytes, an object, a dict of another class,
    a key that is not a string), as words; None where all of it is plain."""
    for key, value in [("", config), *entries(config)]:
        if type(value) not in PLAIN_TYPES:
            return f"a {type(value).__name__} at {key or 'its top'}"
        odd_keys = [name for name in value if type(name) is not str] if type(value) is dict else []
        if odd_keys:
            return f"a key that is not a string ({odd_keys[0]!r}) at {key or 'its top'}"
    return None


def check_stored_config(config: Any, source: str, trust: TrustedTargets) -> None:
    """Refuse, in one line, a config read from `source` (a checkpoint) that holds anything but plain data, or whose
    rebuilt parts (`REBUILT`) name a target `trust` does not trust or hold an interpolation (a resolver acts as it
    resolves)."""
    if config is None:  # a Lightning checkpoint the project did not write: the command line builds its run
        return

    def refused(what: str) -> UntrustedConfig:
        return UntrustedConfig(
            f"{source}: its stored config {what}: it is not opened; use a checkpoint project.train wrote"
        )

    if type(config) is not dict:
        raise refused(f"is a {type(config).__name__}, not a mapping of keys to values")
    odd = not_plain(config)
    if odd is not None:
        raise refused(f"holds {odd}, where a config holds only dicts, lists, strings, numbers, booleans and null")
    rebuilt = {part: value for part, value in config.items() if part in REBUILT}
    interpolated = next(((k, v) for k, v in entries(rebuilt) if isinstance(v, str) and "${" in v), None)
    if interpolated is not None:
        key, value = interpolated
        raise refused(
            f"holds {key}={value}, an interpolation, which the project never stores (it stores its configs resolved) "
            "and which could act as it resolves"
        )
    for key, target in target_keys(rebuilt):
        if not (isinstance(target, str) and DOTTED_NAME.fullmatch(target)):
            raise refused(f"names {key}={target!r}, which is not the dotted name of a class or function")
        if not trust.trusts(MOVED_TARGETS.get(target, target)):
            raise UntrustedConfig(
                f"{source}: its stored config names {key}={target}, which no config file here names and "
                f"trusted_targets does not trust, so it is neither imported nor run: if you trust that code, add "
                f"+trusted_targets.{target.rsplit('.', 1)[-1]}={target} (or give the config dir that names it, "
                "'hydra.searchpath=[file://<dir>]')"
            )


def trusted_instantiation(trust: TrustedTargets) -> AbstractContextManager:
    """On Hydra 1.4, `trust` as the whitelist for every `instantiate` inside; nothing on Hydra 1.3."""
    return execution_whitelist(trust.as_whitelist)


# Python's audit events (docs.python.org/3/library/audit_events.html) that change what is on disk, each with the
# positions of the paths it changes among its arguments. `open` (a write where its mode or flags say so) is judged
# apart; torch.save writes through torch's own C++ writer, which Python does not audit.
CHANGES_PATHS = {
    "os.mkdir": (0,),
    "os.rmdir": (0,),
    "os.remove": (0,),
    "os.rename": (0, 1),
    "os.link": (1,),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "os.mkfifo": (0,),
    "os.mknod": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
    "shutil.copytree": (1,),
    "shutil.move": (0, 1),
    "shutil.unpack_archive": (1,),
    "shutil.make_archive": (0,),
    "sqlite3.connect": (0,),
}
# The argument holding the directory a relative path of the event is taken from (`dir_fd`), where it has one.
DIR_FD_ARGUMENT = {
    "os.mkdir": 2,
    "os.rmdir": 1,
    "os.remove": 1,
    "os.symlink": 2,
    "os.chmod": 2,
    "os.chown": 3,
    "os.mkfifo": 2,
    "os.mknod": 2,
}
# Calls that change a path and that Python does not audit (3.11 raises no event for them): `install_audit_hook` has
# them raise their event, with the arguments (path, mode, dir_fd), before they run.
UNAUDITED = ("mkfifo", "mknod")
CONNECTS = {
    "socket.connect",
    "socket.sendto",
    "socket.sendmsg",
    "socket.bind",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
    "socket.getnameinfo",
    "urllib.Request",
    "http.client.connect",
    "ftplib.connect",
    "smtplib.connect",
    "imaplib.open",
    "poplib.connect",
    "webbrowser.open",
}
STARTS_PROGRAMS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile"}
# The flags of an `open` that change the disk (appending writes nothing without a write mode).
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC


class ActedOutsideTheRun(UntrustedConfig):
    """Building what a config read from disk describes tried what a file someone else made may not make a run do."""


@dataclass
class Confinement:
    """While what a config read from disk describes is built (and its data prepared), this process writes only below
    `writable` (the run's dir, and the dirs the user's own command line names), connects out only where `may_connect`
    (the user asked for a download), starts no program and unpickles nothing: each operation Python audits is judged
    before it happens, and the first refused ends the build in one line (`ActedOutsideTheRun`), even where the code
    that tried caught the error.

    A net under the exact names, not a sandbox: what a target does in C (torch's file writer) is not audited, nor what
    the rebuilt module does later, in its own steps (the user's code)."""

    source: str
    writable: tuple[Path, ...]
    may_connect: bool
    fix: str
    refusal: ActedOutsideTheRun | None = None
    entered: list[tuple["Confinement | None", bool]] = field(default_factory=list)

    def __enter__(self) -> "Confinement":
        """Entered again inside itself (a data module's `setup` calling its `prepare_data`), it stays active until
        the outermost entry ends."""
        global ACTIVE_CONFINEMENT
        install_audit_hook()
        self.entered.append((ACTIVE_CONFINEMENT, sys.dont_write_bytecode))
        ACTIVE_CONFINEMENT, sys.dont_write_bytecode = self, True  # imports write no __pycache__ meanwhile
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: Any) -> None:
        global ACTIVE_CONFINEMENT
        ACTIVE_CONFINEMENT, sys.dont_write_bytecode = self.entered.pop()
        if self.refusal is not None:  # whatever else went wrong after it: the refusal is what the user must know
            raise self.refusal from None

    def judge(self, event: str, arguments: tuple) -> None:
        """Refuse `event` where it is not allowed: record it, and raise it into the code that tried."""
        tried = self.what_is_refused(event, arguments)
        if tried is None:
            return
        refusal = ActedOutsideTheRun(
            f"{self.source}: building the run its stored config describes tried to {tried}, which a checkpoint's "
            f"config may not make a run do: it was stopped before it did; {self.fix}"
        )
        self.refusal = self.refusal or refusal
        raise refusal

    def what_is_refused(self, event: str, arguments: tuple) -> str | None:
        if event == "open":
            path, mode, flags = arguments
            writes = any(letter in mode for letter in "wax+") if isinstance(mode, str) else bool(flags & WRITE_FLAGS)
            return self.outside(path) if writes else None
        if event in CHANGES_PATHS:
            dir_fd = arguments[DIR_FD_ARGUMENT[event]] if event in DIR_FD_ARGUMENT else None
            if event == "os.mkdir" and self.makes_a_way_to_a_writable_dir(self.resolved(arguments[0], dir_fd)):
                return None
            if event == "sqlite3.connect" and str(arguments[0]) in ("", ":memory:"):
                return None
            return next(filter(None, (self.outside(arguments[at], dir_fd) for at in CHANGES_PATHS[event])), None)
        if event in CONNECTS and not self.may_connect:
            return f"connect out ({event} {shown_arguments(arguments)})"
        if event in STARTS_PROGRAMS:
            return f"start a program ({event} {shown_arguments(arguments)})"
        if event == "pickle.find_class":
            return f"unpickle {'.'.join(map(str, arguments))} (a pickle runs what it names)"
        return None

    def outside(self, path: Any, dir_fd: int | None = None) -> str | None:
        """What writing `path` is, where it lies outside every writable dir; None where it lies inside one, or is an
        open file's number (judged when it was opened)."""
        if isinstance(path, int):
            return None
        resolved = self.resolved(path, dir_fd)
        if resolved is not None and any(Path(resolved).is_relative_to(root) for root in self.writable):
            return None
        where = ", ".join(str(root) for root in self.writable) or "none"
        return f"write {shown_arguments((path,))} (outside the dirs this run may write: {where})"

    def makes_a_way_to_a_writable_dir(self, directory: str | None) -> bool:
        """Whether making `directory` changes nothing (it exists) or makes a dir above one this run may write."""
        if directory is None:
            return False
        return os.path.isdir(directory) or any(root.is_relative_to(directory) for root in self.writable)

    @staticmethod
    def resolved(path: Any, dir_fd: int | None) -> str | None:
        """`path` made absolute, links resolved, a relative one taken from `dir_fd`'s directory where given (None
        where that directory cannot be told)."""
        path = os.fsdecode(os.fspath(path))
        if dir_fd not in (None, -1) and not os.path.isabs(path):
            try:
                path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
            except OSError:
                return None
        return os.path.realpath(path)


ACTIVE_CONFINEMENT: Confinement | None = None
AUDIT_HOOK_INSTALLED = False


def install_audit_hook() -> None:
    """Python's audit hooks stay for the process's life: one, judging events only while a `Confinement` is active."""
    global AUDIT_HOOK_INSTALLED
    if not AUDIT_HOOK_INSTALLED:
        sys.addaudithook(audit)
        for name in UNAUDITED:
            if hasattr(os, name):
                setattr(os, name, raising_its_event(getattr(os, name), f"os.{name}"))
        AUDIT_HOOK_INSTALLED = True


def raising_its_event(function: Callable, event: str) -> Callable:
    """`function` (`os.mkfifo(path, mode, ...)`, `os.mknod`) raising `event` first, as an audited call does."""

    @functools.wraps(function)
    def audited(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> Any:
        sys.audit(event, path, args[0] if args else kwargs.get("mode"), -1 if dir_fd is None else dir_fd)
        return function(path, *args, dir_fd=dir_fd, **kwargs)

    return audited


def audit(event: str, arguments: tuple) -> None:
    confinement = ACTIVE_CONFINEMENT
    if confinement is not None:
        confinement.judge(event, arguments)


def shown_arguments(arguments: tuple) -> str:
    """An event's arguments as text for a line, sockets and long values shortened."""
    return ", ".join(str(argument)[:200] for argument in arguments if not hasattr(argument, "fileno"))
