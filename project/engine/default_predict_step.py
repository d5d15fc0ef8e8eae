"""Lightning's default `predict_step`, for a module that defines none: it calls the module's `forward` with the whole
batch as one argument. A `forward` whose arguments cannot take it so (inputs and targets as two arguments) fails at
that call with a TypeError, which here becomes one line saying to define `predict_step`.

Only that failure: a module that defines its own `predict_step`, or a TypeError raised inside its `forward` (its own
code, once the call has bound its arguments), keeps its traceback. So does a `forward(x)` handed the whole `(x, y)`,
which fails inside its own code: nothing tells that apart from a fault of that code.
"""

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L
import torch.nn.modules.module
from lightning.pytorch.utilities.model_helpers import is_overridden

from project.engine.errors import UserError

DEFAULT_PREDICT_STEP = L.LightningModule.predict_step.__code__
# Where torch's `Module.__call__` runs, between the default predict_step and the module's forward.
MODULE_CALL_FILE = torch.nn.modules.module.__file__


def forward_refused_the_batch(error: TypeError, module: L.LightningModule) -> bool:
    """Whether `error` is the module's `forward` refusing, as it was called, what Lightning's default `predict_step`
    gave it: no frame after that predict_step's is anything but torch's call of a module."""
    if is_overridden("predict_step", module):
        return False
    codes = [frame.f_code for frame, _ in traceback.walk_tb(error.__traceback__)]
    if DEFAULT_PREDICT_STEP not in codes:
        return False
    return all(code.co_filename == MODULE_CALL_FILE for code in codes[codes.index(DEFAULT_PREDICT_STEP) + 1 :])


@contextmanager
def predict_step_needed(module: L.LightningModule) -> Iterator[None]:
    """Run a prediction of `module`; its forward refusing the batch of the default predict_step is one line."""
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
