"""A test-only callback that kills its own process, to interrupt a run as a crash or a preemption would."""

import os
import signal

import lightning as L


class KillAtEpochStart(L.Callback):
    """SIGKILLs the process when epoch `epoch` starts: epochs before it are complete and checkpointed.

    `rank`: only the process of that global rank dies (the others are left to notice); `attempt`: only in that
    torchrun attempt (TORCHELASTIC_RESTART_COUNT), so that the restarted processes run on.
    """

    def __init__(self, epoch: int, rank: int | None = None, attempt: int | None = None) -> None:
        self.epoch, self.rank, self.attempt = epoch, rank, attempt

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch != self.epoch or self.rank not in (None, trainer.global_rank):
            return
        if self.attempt is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == self.attempt:
            os.kill(os.getpid(), signal.SIGKILL)
