"""The bookkeeping around a run, shared by both training paths: its directory, log file, per-rank history, results,
checkpoints, and the summary of a sweep. Nothing here trains."""
