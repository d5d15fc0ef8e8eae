"""Pruning the trials of an Optuna search (hydra_plugins/resumable_optuna_sweeper/) from inside their jobs."""
