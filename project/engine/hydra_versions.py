"""The calls that differ between Hydra 1.3 and 1.4 (and OmegaConf 2.3 and 2.4), made here so that the project reads
the same on both, and neither prints a deprecation warning.

- `version_base`: Hydra 1.3 wants `version_base="1.3"` (without it, it warns and keeps 1.1's defaults); 1.4 has
  deprecated the argument, and its behaviour is that base's where the project relies on it. `VERSION_BASE` is what
  to pass to `hydra.main`, `initialize`, `initialize_config_dir`.
- Hydra 1.4 takes an execution whitelist for `instantiate` and warns where none is given (1.5 will refuse):
  `hydra_main` gives the one Hydra itself needs before the job starts (its callbacks, a sweeper's, a launcher's, its
  logging handlers, all from the composed config: the user's own files and command line, trusted as on Hydra 1.3),
  and `execution_whitelist` is Hydra's context manager for everything the job instantiates (nothing on 1.3).
  `project.engine.trusted_targets` decides what goes on that list.
- OmegaConf 2.4 renames `register_new_resolver` to `register_resolver` (2.3's `register_resolver` is an older API).
- Hydra 1.4 refuses to pickle a `_partial_` factory (its private `_DeferredTarget`, which checks at each call what
  the call may run): a module holding one (the example's optimizer and schedule) cannot be sent to the workers of
  `trainer=ddp_spawn`. It is pickled here as the `functools.partial` it is: its target was checked when it was made,
  and a worker calls it only with what the module gives it. This can go once Hydra pickles them, or once no
  strategy the project offers pickles the module.
"""

import copyreg
import functools
import importlib
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import hydra
import hydra.utils
import omegaconf
from omegaconf import DictConfig, OmegaConf

# Hydra 1.4's execution whitelist (`instantiate(_execution_whitelist_=...)`, `hydra.main(execution_whitelist=...)`).
HAS_EXECUTION_WHITELIST = hasattr(hydra.utils, "execution_whitelist")
VERSION_BASE: dict[str, str] = {} if HAS_EXECUTION_WHITELIST else {"version_base": "1.3"}
OMEGACONF_2_4 = tuple(int(part) for part in omegaconf.__version__.split(".")[:2]) >= (2, 4)


def plain_partial(factory: functools.partial) -> tuple:
    """How pickle rebuilds a Hydra 1.4 `_partial_` factory: as a plain `functools.partial` of the same call."""
    return functools.partial(factory.func, *factory.args, **factory.keywords).__reduce__()


if HAS_EXECUTION_WHITELIST:
    from hydra._internal.execution_policy import _DeferredTarget

    copyreg.pickle(_DeferredTarget, plain_partial)


def hydra_main(config_path: str, config_name: str, job_whitelist: Callable[[DictConfig], list[str]]) -> Callable:
    """`@hydra.main(config_path, config_name)` for an entry point, on either Hydra; on 1.4 every `instantiate` of the
    job runs under the whitelist `job_whitelist(cfg)` (and Hydra's own, before the job, under none: the composed
    config is the user's)."""
    if not HAS_EXECUTION_WHITELIST:
        return hydra.main(config_path=config_path, config_name=config_name, **VERSION_BASE)

    def decorate(task: Callable[[DictConfig], Any]) -> Callable:
        @functools.wraps(task)
        def job(cfg: DictConfig) -> Any:
            try:
                whitelist = job_whitelist(cfg)
            except Exception:  # a config that cannot be read (a `${...}` naming nothing): the job says so in one line
                return task(cfg)
            with execution_whitelist(lambda: whitelist):
                return task(cfg)

        composed_is_the_users = hydra.utils.UNSAFE_DISABLE_EXECUTION_CHECKS
        return hydra.main(config_path=config_path, config_name=config_name, execution_whitelist=composed_is_the_users)(
            job
        )

    return decorate


def execution_whitelist(targets: Callable[[], list[str]]) -> AbstractContextManager:
    """Hydra 1.4's whitelist `targets()` (exact names and `<package>.*`) for every `instantiate` inside, in place of
    the one around it; nothing on Hydra 1.3, which has none (nor asks for the list).

    Hydra 1.4 also checks what a target returns, where that is callable (a network, a transform), by the name of
    its class where it is defined (`torchvision.transforms.v2._geometry.RandomCrop` for the config's
    `torchvision.transforms.v2.RandomCrop`): an exact name is given with that name beside it.
    """
    if not HAS_EXECUTION_WHITELIST:
        return nullcontext()
    listed = targets()
    defined_as = [defined_name(located(target)) for target in listed if not target.endswith(".*")]
    return hydra.utils.execution_whitelist([*listed, *filter(None, defined_as)], reset=True)


def defined_name(found: Any) -> str | None:
    """`<module>.<qualified name>` where a class or function is defined; None for anything else."""
    if not (inspect.isclass(found) or inspect.isfunction(found)):
        return None
    return f"{found.__module__}.{found.__qualname__}"


def located(target: str) -> Any:
    """What the dotted name `target` names, found as Hydra finds a target (attributes first, then submodules),
    importing the modules it passes through; None where nothing is."""
    parts = target.split(".")
    try:
        found = importlib.import_module(parts[0])
    except ImportError:
        return None
    for index, part in enumerate(parts[1:], start=1):
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        if not inspect.ismodule(found):
            return None
        try:
            found = importlib.import_module(".".join(parts[: index + 1]))
        except ImportError:
            return None
    return found


def register_resolver(name: str, resolver: Callable, replace: bool = False, use_cache: bool = False) -> None:
    """`${name:...}` calls `resolver`, on OmegaConf 2.3 and 2.4."""
    register = OmegaConf.register_resolver if OMEGACONF_2_4 else OmegaConf.register_new_resolver
    register(name, resolver, replace=replace, use_cache=use_cache)
