"""Multi-node launches without Slurm: torchrun, ending a failed launch in one line."""
