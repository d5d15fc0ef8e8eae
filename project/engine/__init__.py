"""The machinery every run goes through, for any LightningModule and LightningDataModule; nothing here knows the worked
example or the optional parts. Its modules, in the order `python -m project.train` meets them:

- startup: a SIGTERM while a run starts ends it in one line, with no process left.
- run_log: which rank this process is; the console's lines also in the run's log file.
- upstream: every private or version-dependent name of Lightning, torch, Hydra and OmegaConf, and their noise silenced.
- errors: runs that end early through no bug, reported in one line; typos in overrides and the nearest keys.
- config: the run's resolved config (stored in each checkpoint), its values checked, the hints a constructor takes.
- trusted_targets: which `_target_`s a config read from disk (a checkpoint's) may name.
- run_dir: the run directory, the same for every process of one launch and for no other launch.
- build: the data module, module, callbacks, loggers and Trainer built from the config.
- schedules: learning-rate schedules from config, sized to the run.
- ddp: DDP whose extra processes re-run this Hydra job; ranks agreeing on flags; waits on peers that end in one line.
- checkpoints: which checkpoint a run resumes from, refused files, what it restores checked, atomic writes, the best
  checkpoint.
- history: what each process saw in training; the stop of a run that diverges.
- reports: the results table and results.json, progress lines or bar, every logger's table of runs.
- job: one job from launch to end: each early end in one line, nothing left for the next job of a sweep.
- sweeps: a sweep's table and seed/fold summary, and carrying a stopped sweep on.
- trained_run (project.evaluate, project.predict): a run rebuilt from its checkpoint; its predictions written.

What each guards and why (the upstream behaviour it works around) is in docs/engine.md; what a module of yours may
rely on, in docs/your-code.md."""
