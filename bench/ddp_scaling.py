"""gloo DDP on the CPU: two processes against one, at the same global batch and at the same per-rank batch.

One process trains with all the machine's cores (torch's default threads); each DDP rank gets one intra-op thread,
so that two ranks share the cores instead of fighting over them. Each repeat runs the one-process epoch here, then
starts two fresh processes (`torch.multiprocessing.spawn`) that run both DDP epochs; every timed epoch is
preceded by a few untimed warm-up steps.
"""

import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra.utils import instantiate
from matplotlib.figure import Figure
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Sampler
from torch.utils.data.distributed import DistributedSampler

from bench.plots import bars
from bench.report import Row, ratio_cell
from bench.settings import Settings
from bench.timing import paired_ratio
from bench.training_runs import compose_config, load_datamodule, train_step
from project.engine.checkpoints import SeededOrder
from project.engine.ddp import reserved_port
from project.example.data.in_memory import keep_batch

WARMUP_STEPS = 5


def timed_epoch(cfg, datamodule, batch_size: int, sampler: Sampler, distributed: bool) -> float:
    """Seconds of one epoch of `sampler`'s share of the training set, after a short untimed warm-up."""
    torch.manual_seed(cfg.seed)
    network = instantiate(cfg.model.network)
    model = DistributedDataParallel(network) if distributed else network
    optimizer = instantiate(cfg.model.optimizer)(network.parameters())
    loader = DataLoader(datamodule.train_set, batch_size=batch_size, sampler=sampler, collate_fn=keep_batch)
    for _, batch in zip(range(WARMUP_STEPS), loader, strict=False):
        train_step(model, optimizer, *batch)
    if distributed:
        dist.barrier()
    start = time.perf_counter()
    for batch in loader:
        train_step(model, optimizer, *batch)
    if distributed:
        dist.barrier()  # the epoch ends when the slower rank is done
    return time.perf_counter() - start


def rank_main(rank: int, world_size: int, port: int, recipe: list[str], scratch: str, out: str) -> None:
    """One DDP rank: both two-process configurations, one epoch each; rank 0 writes the times to `out`."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        cfg = compose_config(recipe, Path(scratch))
        datamodule = load_datamodule(cfg)
        per_rank = {
            "same global batch": datamodule.batch_size // world_size,
            "same per-rank batch": datamodule.batch_size,
        }
        sampler = DistributedSampler(datamodule.train_set, world_size, rank, shuffle=True, seed=cfg.seed)
        seconds = {name: timed_epoch(cfg, datamodule, size, sampler, True) for name, size in per_rank.items()}
        if rank == 0:
            Path(out).write_text(json.dumps(seconds))
    finally:
        dist.destroy_process_group()


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    cfg = compose_config(recipe, scratch)
    datamodule = load_datamodule(cfg)
    samples = len(datamodule.train_set)
    one, two = [], {"same global batch": [], "same per-rank batch": []}
    for repeat in range(settings.repeats):
        sampler = SeededOrder(datamodule.train_set, cfg.seed)
        one.append([timed_epoch(cfg, datamodule, datamodule.batch_size, sampler, False)])
        out = scratch / f"ddp-{repeat}.json"
        threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # for the children, before their torch starts its thread pool
        try:
            with reserved_port() as holder:
                port = holder.getsockname()[1]
                mp.spawn(rank_main, args=(2, port, recipe, str(scratch), str(out)), nprocs=2, join=True)
        finally:
            os.environ.pop("OMP_NUM_THREADS") if threads is None else os.environ.update(OMP_NUM_THREADS=threads)
        for name, seconds in json.loads(out.read_text()).items():
            two[name].append([seconds])
    return {
        "threads_one_process": torch.get_num_threads(),
        "samples_per_second": {
            "1 process": [samples / s for [s] in one],
            **{f"2 processes, {name}": [samples / s for [s] in times] for name, times in two.items()},
        },
        "two_vs_one": {name: paired_ratio(one, times).as_dict() for name, times in two.items()},
    }


def rows(result: dict) -> list[Row]:
    return [
        (f"DDP: 2 processes / 1, {name}", ratio_cell(spread), "gloo, 1 thread per rank")
        for name, spread in result["two_vs_one"].items()
    ]


def draw(result: dict, out: Path, stem: str) -> list[Path]:
    """`<stem>-ddp-scaling.png`: samples/s of each configuration, against twice one process's."""
    rates = result["samples_per_second"]
    figure = Figure(figsize=(7, 3.5), layout="constrained")
    axes = figure.subplots()
    bars(axes, list(rates), list(rates.values()), "gloo DDP on the CPU (one epoch)", "samples / s (all ranks)")
    axes.axvline(2 * statistics.median(rates["1 process"]), color="grey", linestyle="--", label="2 × one process")
    axes.legend(loc="lower right")
    path = out / f"{stem}-ddp-scaling.png"
    figure.savefig(path)
    return [path]
