"""A test-only callback that kills its own process, to interrupt a run as a crash or a preemption would."""

import os
import signal

import lightning as L


class KillAtEpochStart(L.Callback):
    """SIGKILLs the process when epoch `epoch` starts: epochs before it are complete and checkpointed."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)
