"""Switches off the SIGTERM broadcast Lightning's training loop makes before every batch, for strategies that agree on
SIGTERM themselves.

Lightning 2.6 (`_TrainingEpochLoop._broadcast_sigterm_tensor`, from Lightning-AI/pytorch-lightning#20825) broadcasts
rank 0's SIGTERM flag over the training process group before every training batch and reads it back with `.item()`:
one collective and one host-device sync per step, on the device that trains (upstream issue
Lightning-AI/pytorch-lightning#21487; the open PR #21640 would make it every N steps). `HydraJobRanks` agrees on
SIGTERM over a small CPU group, asynchronously, so the broadcast only costs. This private override goes once Lightning
lets a strategy (or the Trainer) skip it.
"""

import lightning as L


def skip_lightning_sigterm_broadcast(trainer: L.Trainer) -> None:
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
