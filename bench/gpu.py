"""What only the GPU variant (`--gpu`) measures: bf16-mixed against fp32, and `trainer=dp` on one GPU, each against
the reference loop on the same GPU-resident data. With `--device cpu` the same code runs on the CPU (a check of
the code, not a GPU number)."""

from pathlib import Path

from bench.lightning_overhead import compare_to_reference, comparison_panel, comparison_rows
from bench.plots import Panel
from bench.report import Row
from bench.settings import Settings

DP_CONFIG = Path(__file__).resolve().parents[1] / "conf" / "trainer" / "dp.yaml"


def variants(settings: Settings) -> dict[str, list[str]]:
    """Lightning fp32 first (its loss curve is recorded), then bf16-mixed, then DataParallel on device 0 (where the
    dp part is here: it goes with its `conf/trainer/dp.yaml`)."""
    trainer = settings.trainer_override()
    chosen = {"fp32": [trainer], "bf16-mixed": [trainer, "++trainer.precision=bf16-mixed"]}
    if DP_CONFIG.is_file():
        chosen["dp, devices=[0]"] = ["trainer=dp", *(["trainer.devices=[0]"] if settings.device == "cuda" else [])]
    return chosen


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    return compare_to_reference(settings, recipe, variants(settings), scratch)


def rows(result: dict) -> list[Row]:
    return comparison_rows(result, "GPU Lightning")


def panels(result: dict) -> list[Panel]:
    return [comparison_panel(result, "GPU Lightning", "GPU variants: epochs with validation")]
