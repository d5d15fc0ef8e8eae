"""ResumableOptunaSweeper: Hydra's Optuna sweeper, carrying on a study stored in the sweep dir."""
