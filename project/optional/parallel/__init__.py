"""`hydra/launcher=parallel`: the jobs of a sweep side by side on one machine, each on devices of its own."""
