"""The raw-PyTorch path: what Lightning does, written out by hand, one file per strategy.

Read them in order: `single` (the plain loop), `dp` (`nn.DataParallel`), `ddp` (one process per device, torchrun),
`slurm` (one task per node that spawns one process per device). Each reads the same conf/ as `project.train`,
shares the networks and data with it, and runs the loop in `loop.py`; each differs from `single` only by what its
strategy needs. Tests check that each gives the numbers the Lightning path gives.
"""
