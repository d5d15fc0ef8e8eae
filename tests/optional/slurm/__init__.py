"""Tests of the Slurm part: sbatch templates, trainer=slurm, the submitit launcher, the local cluster."""
