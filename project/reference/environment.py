"""The variables the multi-process reference scripts need from their launcher (torchrun, srun), checked first."""

import os

from project.errors import UserError


def require_environment(script: str, variables: tuple[str, ...], how_to_launch: str) -> dict[str, str]:
    """The launcher's variables, or a `UserError` saying how `script` must be started."""
    missing = [name for name in variables if name not in os.environ]
    if missing:
        raise UserError(f"{script} needs {', '.join(missing)} from its launcher: start it as `{how_to_launch}`")
    return {name: os.environ[name] for name in variables}
