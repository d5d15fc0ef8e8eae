"""`python -m bench [--quick] [--gpu] [--device cpu|cuda] [--only SUITE ...] [--data-root DIR] [--out DIR]`: run the
suites, print the table, write `<out>/<date>[-gpu][-quick].json` and its PNGs.

A suite whose file is not here (an optional part deleted, its benchmark with it) is left out, with one line saying
so. A suite that fails is reported in the table and the JSON, and the others still run; the exit status is 1 then.
"""

import argparse
import importlib
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType

import torch

from bench import plots, report
from bench.dataset import find_root, small_copy
from bench.settings import Settings
from project.engine.errors import UserError

QUICK_SIZES = {"train": 3000, "test": 1000}
BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
# The suites in the order they run (bench/__init__.py says what each is); the GPU variant shares the device-neutral
# ones with the CPU bench.
CPU_SUITES = (
    "data_path",
    "lightning_overhead",
    "startup",
    "ddp_scaling",
    "preemption",
    "memory",
    "sweep_leaks",
    "side_by_side",
    "fsdp_memory",
    "image_folder",
    "time_to_accuracy",
)
GPU_SUITES = ("data_path", "lightning_overhead", "gpu", "side_by_side", "time_to_accuracy")


def declared(gpu_variant: bool) -> tuple[str, ...]:
    return GPU_SUITES if gpu_variant else CPU_SUITES


def is_here(name: str) -> bool:
    """Whether the suite's file is in this tree: an optional part's suite is deleted with the part."""
    return (BENCH / f"{name}.py").is_file()


def suites(gpu_variant: bool) -> list[str]:
    """The suites of the CPU bench or of the GPU variant that this tree has, in order."""
    return [name for name in declared(gpu_variant) if is_here(name)]


def chosen_suites(only: list[str] | None, gpu_variant: bool) -> list[str]:
    """`--only`'s suites, each of which must be here; else every suite here, saying which are not."""
    here = suites(gpu_variant)
    if only:
        unknown = [name for name in only if name not in here]
        if unknown:
            gone = "".join(f"; bench/{name}.py is not here" for name in unknown if name in declared(gpu_variant))
            suites_here = f"this tree's suites{' with --gpu' if gpu_variant else ''} are {', '.join(here)}"
            raise SystemExit(f"error: --only {' '.join(unknown)}: {suites_here}{gone}")
        return [name for name in here if name in only]
    for name in declared(gpu_variant):
        if name not in here:
            print(f"bench: {name} left out: bench/{name}.py is not here (its optional part was removed)", flush=True)
    return here


def gather(hook: str, modules: dict[str, ModuleType], results: dict[str, dict], *args) -> list:
    """What `hook(result, *args)` gives for each suite that ran to its end and has that hook, in the run's order."""
    return [
        item
        for name, module in modules.items()
        if "error" not in results[name] and hasattr(module, hook)
        for item in getattr(module, hook)(results[name], *args)
    ]


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
    chosen = chosen_suites(args.only, args.gpu)
    started = time.perf_counter()
    stem = report.today() + ("-gpu" if args.gpu else "") + ("-quick" if args.quick else "")
    modules: dict[str, ModuleType] = {}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        try:
            root = find_root(args.data_root, scratch)
        except UserError as error:
            raise SystemExit(f"error: {error}") from None
        if args.quick:
            root = small_copy(root, scratch, QUICK_SIZES)
        settings = Settings.make(args.quick, device, root.resolve(), gpu_variant=args.gpu)
        recipe = settings.recipe()
        for name in chosen:
            print(f"bench: {name} ...", flush=True)
            suite_start = time.perf_counter()
            try:
                (scratch / name).mkdir()
                modules[name] = importlib.import_module(f"bench.{name}")
                result = modules[name].run(settings, recipe, scratch / name)
                results[name] = result | {"suite_seconds": time.perf_counter() - suite_start}
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
    written = [report.save(record, out, stem)]
    written += plots.throughput(gather("panels", modules, results), out / f"{stem}-throughput.png")
    written += gather("draw", modules, results, out, stem)
    rows = report.failed_rows(results) + gather("rows", modules, results)
    print(report.format_table(record, rows, gather("details", modules, results)), flush=True)
    print("wrote " + ", ".join(str(path) for path in written), flush=True)
    return 1 if any("error" in result for result in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
