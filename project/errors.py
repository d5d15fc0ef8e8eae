"""The one exception type for mistakes a user can fix, and the entry points' way of reporting it.

Entry points wrap their work in `exit_on_user_error`: a `UserError` (or Lightning's own misconfiguration error),
even when Hydra's `instantiate` has wrapped it, becomes one line on stderr and exit status 2. Anything else is a
bug and keeps its traceback.
"""

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from lightning.fabric.utilities.exceptions import MisconfigurationException

P = ParamSpec("P")
R = TypeVar("R")


class UserError(Exception):
    """A problem in the user's input or environment; its message says what to change."""


def find_user_error(error: BaseException | None) -> BaseException | None:
    """The `UserError` (or Lightning misconfiguration) behind `error`, following `raise ... from` chains."""
    while error is not None:
        if isinstance(error, (UserError, MisconfigurationException)):
            return error
        error = error.__cause__ or error.__context__
    return None


def exit_on_user_error(function: Callable[P, R]) -> Callable[P, R]:
    """Run `function`; turn a user's mistake into one `error: ...` line and exit status 2."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            user_error = find_user_error(error)
            if user_error is None:
                raise
            message = " ".join(str(user_error).split())
            print(f"error: {message}", file=sys.stderr, flush=True)
            if "SUBMITIT_EXECUTOR" in os.environ:
                raise  # a submitit job reports an exception as its failure; an exit would leave the sweep waiting
            sys.exit(2)

    return wrapper
