"""A Lightning + Hydra training template with a raw-PyTorch reference path beside it."""

from project.runs.run_dir import register_resolvers

# Every entry point composes conf/, whose run directory uses `${launch_dir:}`.
register_resolvers()
