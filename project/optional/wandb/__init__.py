"""`logger=wandb`: Weights & Biases runs named after the run dir, offline unless this machine is logged in."""
