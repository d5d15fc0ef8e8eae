"""What the libraries print on every run that tells a user of this project nothing, silenced by its text, in one place.

A first run should show the config, the progress and the results: a warning a user can do nothing about teaches
them to skip warnings, and the one that matters is then missed. Each entry names where it comes from and what ends
it upstream, so that it goes when the pins in pyproject.toml move past that. Anything not listed here still prints.
An optional part silences what only it causes, with `DropMessages`, where it is imported.
"""

import logging
import os
import re
import warnings

# (message regex, why it says nothing here, what ends it upstream)
WARNINGS = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "torch 2.14 deprecates a check lightning/pytorch/utilities/_pytree.py still makes",
        "Lightning-AI/pytorch-lightning#21326 (closed; no release up to 2.6.6 has the fix)",
    ),
)
# Printed only outside a Slurm allocation, where nothing is to be prepended: the project's sbatch scripts start
# the ranks under srun themselves, and a run typed on a login node is a local run on purpose. Inside an allocation
# (SLURM_JOB_ID set) the hint can save a hang, and prints.
OUTSIDE_SLURM_WARNINGS = (
    (
        r"The `srun` command is available on your system but is not used",
        "Lightning's hint on a machine that has Slurm installed",
        "lightning/fabric/plugins/environments/slurm.py, any version so far",
    ),
)
# Log records, by the logger that emits them.
LOG_MESSAGES = (
    (
        "lightning.pytorch.utilities.rank_zero",
        r"💡 Tip: For seamless cloud logging",
        "an advertisement for a hosted logger, on every run",
        "lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py since 2.6",
    ),
    (
        "torch.utils.cpp_extension",
        r"No CUDA runtime is found, using CUDA_HOME=",
        "printed by torch.compile's C++ compiler set-up (compile=true) on every machine without a GPU",
        "torch/utils/cpp_extension.py, any version so far",
    ),
)


class DropMessages(logging.Filter):
    """Drops the records whose message matches one of `patterns`."""

    def __init__(self, patterns: list[str]) -> None:
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{pattern})" for pattern in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.match(record.getMessage()) is None


def silence_upstream_noise() -> None:
    """Install the filters (every entry point imports `project`, which calls this once)."""
    listed = WARNINGS if "SLURM_JOB_ID" in os.environ else WARNINGS + OUTSIDE_SLURM_WARNINGS
    for pattern, _, _ in listed:
        warnings.filterwarnings("ignore", message=pattern)
    for name in {name for name, _, _, _ in LOG_MESSAGES}:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, DropMessages) for existing in logger.filters):
            logger.addFilter(DropMessages([pattern for emitter, pattern, _, _ in LOG_MESSAGES if emitter == name]))
