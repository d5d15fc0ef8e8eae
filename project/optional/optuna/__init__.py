"""An Optuna search (`hydra/sweeper=optuna`, hydra_plugins/resumable_optuna_sweeper/): the search itself, its study's
storage, and the pruning of its trials from inside their jobs."""
