"""What to say of an override Hydra could not apply because the config has no such key (`trainer.max_epoch=3`) or its
group no such option (`trainer=ddpp`): the nearest keys or options that do exist.

Hydra's own message ends by advising `+trainer.max_epoch=3`, which would add a key that nothing reads; where a key
or option is near, the line names it instead, and gives the `+` only where none is. `errors.run_hydra_app` calls
`typo_message` on Hydra's composition errors.
"""

import difflib
import re

from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import Container, DictConfig
from omegaconf.errors import OmegaConfBaseException

# Hydra 1.3's words for an override of a key the config does not have, with the command-line text of the override.
NOT_APPLIED = re.compile(r"Could not override '(?P<key>[^']+)'\.\nTo append to your config use \+(?P<override>.+)")
PRINTS_THE_CONFIG = "--cfg job prints the config"
# How alike (difflib's ratio) a name must be to be suggested: `max_epoch` and `max_epochs` are, `max_steps` is not.
CUTOFF = 0.75


def typo_message(error: ConfigCompositionException) -> str | None:
    """The message (without `error: `) for a key or option the config does not have; None for any other error."""
    if isinstance(error, MissingConfigException):
        if error.options and error.missing_cfg_file and "/" in error.missing_cfg_file:
            return unknown_option(error.missing_cfg_file, list(error.options))
        return None
    not_applied = NOT_APPLIED.match(str(error))
    cause = error.__cause__
    if not_applied is None or not isinstance(cause, OmegaConfBaseException) or cause.parent_node is None:
        return None
    keys = dotted_keys(cause.parent_node._get_root())
    return unknown_key(not_applied["key"], keys, not_applied["override"])


def unknown_key(key: str, keys: list[str], override: str) -> str:
    near = nearest_keys(key, keys)
    if near:
        return f"{key} is not a key of the config: did you mean {' or '.join(near)}? ({PRINTS_THE_CONFIG})"
    return (
        f"{key} is not a key of the config, nor near one ({PRINTS_THE_CONFIG}): check its spelling, or write "
        f"+{override} to add a key that your code reads"
    )


def unknown_option(config_file: str, options: list[str]) -> str:
    group, _, name = config_file.rpartition("/")
    near = difflib.get_close_matches(name, options, n=3, cutoff=CUTOFF)
    choices = f"{group} has: {', '.join(options)}"
    if near:
        suggestions = " or ".join(f"{group}={option}" for option in near)
        return f"{group}={name} is not an option of {group}: did you mean {suggestions}? ({choices})"
    return f"{group}={name} is not an option of {group} ({choices}): check its spelling, or add {config_file}.yaml"


def nearest_keys(key: str, keys: list[str]) -> list[str]:
    """The keys nearest to `key`, best first: keys beside it of a similar name (`trainer.max_epochs` for
    `trainer.max_epoch`), found under the nearest existing parents where its own parent is a typo too
    (`trainer.max_epochs` for `trainr.max_epochs`)."""
    parent, _, name = key.rpartition(".")
    parents = [parent] if not parent or parent in keys else nearest_keys(parent, keys)
    beside: dict[str, list[str]] = {}
    for existing in keys:
        existing_parent, _, existing_name = existing.rpartition(".")
        if existing_parent in parents:
            beside.setdefault(existing_name, []).append(existing)
    return [found for near in difflib.get_close_matches(name, beside, n=3, cutoff=CUTOFF) for found in beside[near]]


def dotted_keys(config: Container, prefix: str = "") -> list[str]:
    """Every key of `config`, nested ones dotted (`trainer.max_epochs`), values left unresolved."""
    if not isinstance(config, DictConfig) or config._is_none() or config._is_missing():
        return []
    keys = []
    for key in config:
        keys.append(f"{prefix}{key}")
        keys.extend(dotted_keys(config._get_node(key), f"{prefix}{key}."))
    return keys
