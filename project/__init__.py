"""A Lightning + Hydra training template with a raw-PyTorch reference path beside it."""

from project.runs.run_dir import register_resolvers
from project.upstream_noise import silence_upstream_noise

# Every entry point composes conf/, whose run directory uses `${launch_dir:}`.
register_resolvers()
# Every entry point's first run shows what the user can act on (project/upstream_noise.py lists what it hides).
silence_upstream_noise()
