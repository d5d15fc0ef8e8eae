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


def serves(stage: str, module: L.LightningModule, datamodule: L.LightningDataModule | None) -> bool:
    """Whether `module` or `datamodule` (None: `data=none`) defines `stage`'s dataloader."""
    hook = f"{stage}_dataloader"
    in_data = datamodule is not None and is_overridden(hook, datamodule, L.LightningDataModule)
    return in_data or is_overridden(hook, module, L.LightningModule)


def why_no_test(module: L.LightningModule, datamodule: L.LightningDataModule | None) -> str | None:
    """Why `project.train` tests nothing after training, if it does not: the module defines no `test_step`, or
    nothing defines a `test_dataloader` (training needs neither)."""
    name = type(module).__name__
    if not is_overridden("test_step", module, L.LightningModule):
        return f"{name} defines no test_step"
    if not serves("test", module, datamodule):
        where = "" if datamodule is None else f" nor {type(datamodule).__name__}"
        return f"neither {name}{where} defines a test_dataloader"
    return None


def check_data_for(
    stage: str, module: L.LightningModule, datamodule: L.LightningDataModule | None, program: str
) -> None:
    """Refuse `program`'s `stage` where neither `module` nor `datamodule` (None: `data=none`) defines its dataloader,
    or, for a test, where the module defines no `test_step` (a prediction falls back on `forward`)."""
    name = type(module).__name__
    if stage == "test" and not is_overridden("test_step", module, L.LightningModule):
        raise UserError(f"{program} runs the module's test_step, which {name} does not define: define test_step in it")
    if serves(stage, module, datamodule):
        return
    hook = f"{stage}_dataloader"
    if datamodule is None:
        raise UserError(
            f"{program} needs a {hook}, and {name} defines none while data=none gives it no data module: define "
            f"{hook} in {name}, or choose a data module (data=<option>)"
        )
    raise UserError(
        f"{program} needs a {hook}, which neither {name} nor {type(datamodule).__name__} defines: define "
        f"{hook} in one of them"
    )
