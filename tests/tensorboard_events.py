"""Read scalars back from a run's TensorBoard event files with TensorBoard's own reader."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(log_dir: Path) -> dict[str, list[float]]:
    """Every scalar tag in `log_dir` → its values in step order."""
    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [event.value for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
