"""`python -m bench [--quick] [--gpu] [--device cpu|cuda] [--only SUITE ...] [--data-root DIR] [--out DIR]`: run the
suites, print the table, write `<out>/<date>[-gpu][-quick].json` and its PNGs.

A suite that fails is reported in the table and the JSON, and the others still run; the exit status is 1 then.
"""

import argparse
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from bench import (
    data_path,
    ddp_scaling,
    fsdp_memory,
    gpu,
    image_folder,
    lightning_overhead,
    memory,
    plots,
    preemption,
    report,
    startup,
    time_to_accuracy,
)
from bench.dataset import find_root, small_copy
from bench.settings import Settings
from project.engine.errors import UserError

QUICK_SIZES = {"train": 3000, "test": 1000}
RESULTS = Path(__file__).resolve().parent / "results"


def suites(settings: Settings) -> dict[str, Callable[[Path], dict]]:
    """The suites of this run, in order; the CPU bench and the GPU variant share the device-neutral ones."""
    recipe = settings.recipe()
    chosen: dict[str, Callable[[Path], dict]] = {
        "data_path": lambda scratch: data_path.run(settings, recipe, scratch),
        "lightning_overhead": lambda scratch: lightning_overhead.run(settings, recipe, scratch),
    }
    if settings.gpu_variant:
        chosen["gpu"] = lambda scratch: gpu.run(settings, recipe, scratch)
    else:
        chosen["startup"] = lambda scratch: startup.run(settings, scratch)
        chosen["ddp_scaling"] = lambda scratch: ddp_scaling.run(settings, recipe, scratch)
        chosen["preemption"] = lambda scratch: preemption.run(settings, recipe, scratch)
        chosen["memory"] = lambda scratch: memory.run(settings, recipe, scratch)
        chosen["fsdp_memory"] = lambda scratch: fsdp_memory.run(settings, recipe, scratch)
        chosen["image_folder"] = lambda scratch: image_folder.run(settings, recipe, scratch)
    chosen["time_to_accuracy"] = lambda scratch: time_to_accuracy.run(settings, recipe, scratch)
    return chosen


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small data, one repeat (not numbers)")
    parser.add_argument("--gpu", action="store_true", help="the GPU variant: GPU-resident data, bf16, dp")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda with --gpu, else cpu")
    parser.add_argument("--only", nargs="+", metavar="SUITE", help="run these suites only (e.g. lightning_overhead)")
    parser.add_argument("--data-root", help="a root holding FashionMNIST/raw/ (default: found, see bench/dataset.py)")
    parser.add_argument("--out", type=Path, help="where the JSON and PNGs go (default: bench/results/)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    device = args.device or ("cuda" if args.gpu else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --gpu needs a CUDA GPU; none is visible (use --device cpu to check the code here)")
    started = time.perf_counter()
    stem = report.today() + ("-gpu" if args.gpu else "") + ("-quick" if args.quick else "")
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        try:
            root = find_root(args.data_root, scratch)
        except UserError as error:
            raise SystemExit(f"error: {error}") from None
        if args.quick:
            root = small_copy(root, scratch, QUICK_SIZES)
        settings = Settings.make(args.quick, device, root.resolve(), gpu_variant=args.gpu)
        results: dict[str, dict] = {}
        available = suites(settings)
        unknown = set(args.only or ()) - set(available)
        if unknown:
            raise SystemExit(f"error: --only {' '.join(sorted(unknown))}: this run's suites are {', '.join(available)}")
        chosen = {name: run for name, run in available.items() if not args.only or name in args.only}
        for name, run in chosen.items():
            print(f"bench: {name} ...", flush=True)
            suite_start = time.perf_counter()
            try:
                (scratch / name).mkdir()
                results[name] = run(scratch / name) | {"suite_seconds": time.perf_counter() - suite_start}
            except Exception as error:  # keep going: the other suites still have something to say
                traceback.print_exc()
                results[name] = {"error": f"{type(error).__name__}: {error}"}
            print(f"bench: {name} done in {time.perf_counter() - suite_start:.0f} s", flush=True)
    record = {
        "date": report.today(),
        "mode": ("gpu" if args.gpu else "cpu") + (", quick" if args.quick else "") + f", device {device}",
        "machine": report.machine(),
        "repeats": settings.repeats,
        "suites": results,
        "seconds": time.perf_counter() - started,
    }
    out = args.out or (RESULTS if not args.quick else Path("outputs") / "bench-quick")
    written = [report.save(record, out, stem), *plots.draw_all(results, out, stem)]
    print(report.format_table(record), flush=True)
    print("wrote " + ", ".join(str(path) for path in written), flush=True)
    return 1 if any("error" in result for result in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
