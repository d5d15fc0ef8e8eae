"""A Lightning + Hydra training template: the entry points here, the worked example in example/, the machinery in
engine/, and parts you may delete in optional/."""

from project.engine import startup

# First, before the imports below (seconds): a SIGTERM while a training run starts is one line (engine/startup.py).
if startup.launched_as_training():
    startup.arm()

from project.engine import config, run_dir, schedules  # noqa: E402
from project.engine.upstream import count_samples_exactly, silence_upstream_noise  # noqa: E402

# Every entry point composes conf/, whose run directory uses `${launch_dir:}`, schedules `${run_steps:}` and recipes
# `${subfolders:<dir>}`.
run_dir.register_resolvers()
schedules.register_resolvers()
config.register_resolvers()
# Every entry point's first run shows what the user can act on (project/engine/upstream.py lists what it hides).
silence_upstream_noise()
# Metrics logged across processes that counted different numbers of samples come out right (engine/upstream.py).
count_samples_exactly()
