"""Checks of config values that would otherwise fail deep inside Lightning with an unclear message."""

from omegaconf import DictConfig

from project.errors import UserError


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(cfg: DictConfig) -> None:
    """Raise `UserError` naming the key, the bad value and what is allowed."""
    if not _is_int(cfg.seed):
        raise UserError(f"seed must be an integer, got {cfg.seed!r}")
    max_epochs = cfg.trainer.get("max_epochs")
    if not (_is_int(max_epochs) and max_epochs >= -1):
        raise UserError(f"trainer.max_epochs must be an integer >= 1 (or -1 for no limit), got {max_epochs!r}")
    devices = cfg.trainer.get("devices")
    if _is_int(devices) and devices < 1 and devices != -1:
        raise UserError(f"trainer.devices must be a positive number of devices (or -1 for all), got {devices!r}")
    if cfg.optimized_mode not in ("min", "max"):
        raise UserError(f"optimized_mode must be min or max, got {cfg.optimized_mode!r}")
