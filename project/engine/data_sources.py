"""Whether a stage (train, test, predict) has what it runs on: a step of the module's and a dataloader, of the data
module or of the module itself.

With `data=none` there is no data module and the module serves its own batches (Lightning's BoringModel defines
every `*_dataloader`; its LightningTransformer demo only `train_dataloader`). Lightning looks for a stage's
dataloader in the data module, then in the module; found in neither, it stops training with a message that names no
config, and runs a test or a prediction over no batches at all, writing nothing. Checked here first, each is one line
naming what to define.
"""

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden

from project.engine.errors import UserError


def check_data_for(
    stage: str, module: L.LightningModule, datamodule: L.LightningDataModule | None, program: str
) -> None:
    """Refuse `program`'s `stage` where neither `module` nor `datamodule` (None: `data=none`) defines its dataloader,
    or, for a test, where the module defines no `test_step` (a prediction falls back on `forward`)."""
    name = type(module).__name__
    if stage == "test" and not is_overridden("test_step", module, L.LightningModule):
        raise UserError(f"{program} runs the module's test_step, which {name} does not define: define test_step in it")
    hook = f"{stage}_dataloader"
    if is_overridden(hook, module, L.LightningModule):
        return
    if datamodule is None:
        raise UserError(
            f"{program} needs a {hook}, and {name} defines none while data=none gives it no data module: define "
            f"{hook} in {name}, or choose a data module (data=<option>)"
        )
    if not is_overridden(hook, datamodule, L.LightningDataModule):
        raise UserError(
            f"{program} needs a {hook}, which neither {name} nor {type(datamodule).__name__} defines: define "
            f"{hook} in one of them"
        )
