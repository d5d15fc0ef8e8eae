"""Where a Lightning training step spends its time: cProfile's self time, summed into named parts, per step.

Each function's self time goes to the part its file belongs to; the self time of Python's own functions
(`isinstance`, `contextlib`, `copy`, ...) goes to the parts of their callers, in proportion. cProfile slows Python
code more than the torch kernels it calls, so the parts are read as shares; the measured cost of each feature comes
from `lightning_overhead`'s variants, timed without a profiler.
"""

import cProfile
import pstats
from collections import Counter

import lightning as L

# (part, substrings of "file:function"); the first part that matches a function takes its self time. Attribute
# access on an nn.Module is passed on to the caller, like Python's runtime (Lightning sets one per hook call).
PASSED_ON = ("torch/nn/modules/module.py:__setattr__", "torch/nn/modules/module.py:__getattr__")
PARTS = (
    ("torch kernels (forward, backward, Adam)", ("~:<method 'run_backward'", "~:<built-in method torch", "TensorBase")),
    ("data (sampler, batch gather, DataLoader)", ("torch/utils/data/", "project/example/data/")),
    ("self.log bookkeeping", ("logger_connector/", "core/module.py:log", "core/module.py:__check")),
    ("progress bar", ("callbacks/progress/", "site-packages/tqdm/")),
    (
        "checkpoints",
        ("model_checkpoint.py", "torch/serialization.py", "project/engine/checkpoints.py", "io/torch_io.py"),
    ),
    ("TensorBoard", ("loggers/tensorboard.py", "site-packages/tensorboard/", "torch/utils/tensorboard/")),
    ("torchmetrics updates", ("site-packages/torchmetrics/",)),
    ("project callbacks (history)", ("project/engine/history.py",)),
    # Lightning's own per-step work, which no Trainer flag turns off (the `bare` variant still pays it):
    ("Lightning: hook dispatch", ("pytorch/trainer/call.py", "pytorch/core/hooks.py", "callbacks/callback.py")),
    ("Lightning: optimizer step and closure", ("loops/optimization/", "core/optimizer.py", "plugins/precision/")),
    ("Lightning: hook-signature checks", ("signature_utils.py", "model_helpers.py", "core/overrides.py")),
    ("Lightning: batch fetching", ("loops/fetchers.py", "combined_loader.py")),
    ("Lightning: loops, strategy and progress", ("lightning/pytorch/", "lightning/fabric/", "lightning_utilities/")),
    ("torch Python (optimizer, autograd, nn.Module calls)", ("torch/",)),
)
OTHER = "Python runtime and the rest"


CALLER_DEPTH = 4  # how far up the callers a Python runtime function's time is passed on
CALL_FILE = "lightning/pytorch/trainer/call.py"
HOOK_DISPATCHERS = {  # label: the function in CALL_FILE that dispatches it (one call per hook)
    "LightningModule hooks": "_call_lightning_module_hook",
    "callback hooks": "_call_callback_hooks",
    "strategy hooks": "_call_strategy_hook",
}


def part_of(location: str) -> str:
    if any(marker in location for marker in PASSED_ON):
        return OTHER
    for part, markers in PARTS:
        if any(marker in location for marker in markers):
            return part
    return OTHER


def split_self_time(stats: dict) -> Counter:
    """Seconds per part; a runtime function's time follows its call edges up to a caller that has a part."""
    parts: Counter[str] = Counter()

    def assign(function: tuple, seconds: float, depth: int) -> None:
        file, _, name = function
        part = part_of(f"{file}:{name}")
        callers = stats[function][4] if function in stats else {}
        edge_total = sum(edge[2] for edge in callers.values())
        if part != OTHER or depth == CALLER_DEPTH or edge_total <= 0:
            parts[part] += seconds
            return
        for caller, edge in callers.items():
            assign(caller, seconds * edge[2] / edge_total, depth + 1)

    for function, (_, _, self_seconds, _, _) in stats.items():
        assign(function, self_seconds, 0)
    return parts


class ProfileTraining(L.Callback):
    """Profiles from `on_train_start` to `on_train_end`: the epochs, with their validation and checkpoints."""

    def __init__(self) -> None:
        self.profiler = cProfile.Profile()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.profiler.enable()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.profiler.disable()

    def milliseconds_per_step(self, steps: int) -> dict[str, float]:
        """Each part's self time per training step, largest first."""
        parts = split_self_time(pstats.Stats(self.profiler).stats)
        return {part: seconds / steps * 1000 for part, seconds in parts.most_common()}

    def hook_calls_per_step(self, steps: int) -> dict[str, float]:
        """How many hooks Lightning dispatches per training step (the epoch's validation included, spread over its
        training steps); each callback-hook dispatch goes to every callback."""
        stats = pstats.Stats(self.profiler).stats
        return {
            label: sum(entry[1] for (file, _, name), entry in stats.items() if file.endswith(CALL_FILE) and name == fn)
            / steps
            for label, fn in HOOK_DISPATCHERS.items()
        }
