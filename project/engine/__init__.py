"""The machinery every run goes through, for any LightningModule and LightningDataModule: building a run from its
config, its directory and log, launching its processes, checkpoints and resuming, history, results, sweeps, checks
and one-line errors. Nothing here knows the worked example or the optional parts. What a module of yours may rely
on (and what each feature asks of it, mostly nothing) is written down once, in docs/your-code.md."""
