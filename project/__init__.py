"""A Lightning + Hydra training template with a raw-PyTorch reference path beside it."""

from project.engine import run_dir, schedules
from project.engine.upstream_noise import silence_upstream_noise
from project.optional.image_folder import datamodule as image_folder

# Every entry point composes conf/, whose run directory uses `${launch_dir:}`, schedules `${run_steps:}` and image
# folders `${class_folders:<root>}`.
run_dir.register_resolvers()
schedules.register_resolvers()
image_folder.register_resolvers()
# Every entry point's first run shows what the user can act on (project/engine/upstream_noise.py lists what it hides).
silence_upstream_noise()
