"""How big a bench run is: `--quick` (a smoke run on a small copy of the data) or full, on the CPU or a GPU."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """What every suite needs to know about the run."""

    quick: bool
    device: str  # "cpu" or "cuda"
    data_root: Path
    gpu_variant: bool  # `--gpu`: the GPU suites (on `device`, which is cpu only to check their code)
    repeats: int  # interleaved repeats of each timed candidate
    epochs: int  # epochs per timed fit (each is a timed unit)

    @classmethod
    def make(cls, quick: bool, device: str, data_root: Path, gpu_variant: bool = False) -> "Settings":
        return cls(quick, device, data_root, gpu_variant, repeats=1 if quick else 5, epochs=2)

    @property
    def resident(self) -> bool:
        """In the GPU variant the data lives in the device's memory: one copy up front, none per batch."""
        return self.gpu_variant

    def recipe(self) -> list[str]:
        """The `experiment=mnist` recipe on Fashion-MNIST from this run's data root."""
        overrides = ["experiment=mnist", "data=fashion_mnist", f"data.root={self.data_root}", "data.download=false"]
        return [*overrides, "data.val_size=500"] if self.quick else overrides

    def trainer_override(self) -> str:
        """The trainer config of this device: one process on the CPU, or one GPU."""
        return "trainer=gpu" if self.device == "cuda" else "trainer=cpu"
