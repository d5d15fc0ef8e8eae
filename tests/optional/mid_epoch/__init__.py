"""Tests of the mid-epoch checkpoint (callbacks.mid_epoch_checkpoint) and resuming from it."""
