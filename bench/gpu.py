"""What only the GPU variant (`--gpu`) measures: bf16-mixed against fp32, and `trainer=dp` on one GPU, each against
the reference loop on the same GPU-resident data. With `--device cpu` the same code runs on the CPU (a check of
the code, not a GPU number)."""

from pathlib import Path

from bench.lightning_overhead import compare_to_reference
from bench.settings import Settings


def variants(settings: Settings) -> dict[str, list[str]]:
    """Lightning fp32 first (its loss curve is plotted), then bf16-mixed, then DataParallel on device 0."""
    trainer = settings.trainer_override()
    dp_devices = ["trainer.devices=[0]"] if settings.device == "cuda" else []
    return {
        "fp32": [trainer],
        "bf16-mixed": [trainer, "++trainer.precision=bf16-mixed"],
        "dp, devices=[0]": ["trainer=dp", *dp_devices],
    }


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    return compare_to_reference(settings, recipe, variants(settings), scratch)
