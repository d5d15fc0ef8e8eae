"""A Lightning + Hydra training template with a raw-PyTorch reference path beside it."""

from project import schedules
from project.data import image_folder
from project.runs import run_dir
from project.upstream_noise import silence_upstream_noise

# Every entry point composes conf/, whose run directory uses `${launch_dir:}`, schedules `${run_steps:}` and image
# folders `${class_folders:<root>}`.
run_dir.register_resolvers()
schedules.register_resolvers()
image_folder.register_resolvers()
# Every entry point's first run shows what the user can act on (project/upstream_noise.py lists what it hides).
silence_upstream_noise()
