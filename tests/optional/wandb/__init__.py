"""Tests of logger=wandb."""
