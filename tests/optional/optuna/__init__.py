"""Tests of the Optuna search (hparams_search=, the resumable sweeper, pruning)."""
