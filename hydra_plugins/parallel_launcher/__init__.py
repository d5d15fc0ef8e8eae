"""ParallelLauncher: `hydra/launcher=parallel`, a sweep's jobs side by side on one machine's devices."""
