"""The benchmark suite: `python -m bench [--quick] [--gpu]` (or `make bench`).

Each suite measures its candidates side by side in one process, in interleaved repeats, so that a slower moment
of the machine hits every candidate alike; ratios are medians of per-repeat ratios, with their range. One table
goes to stdout; `bench/results/<date>.json` and PNG plots record the run.

The suites:
    data_path.py          epoch time of the data paths against the compute-only loop (the limit)
    lightning_overhead.py the default Lightning path against the reference loop, and where the time goes
    startup.py            `python -m project.train` on the toy against the bare imports
    ddp_scaling.py        gloo DDP on the CPU: 2 processes against 1
    time_to_accuracy.py   the `experiment=mnist` recipe on Fashion-MNIST: epochs and seconds to 85 %, 88 %, best
    gpu.py                the GPU variant (`--gpu`): bf16-mixed and `trainer=dp` against the reference
What they share:
    settings.py, dataset.py      the run's size and device; where the data is (and its small `--quick` copy)
    training_runs.py             both training paths on one composed config, timed per epoch
    timing.py, profile_costs.py  interleaved repeats and their statistics; a profile split into named parts
    lightning_variants.py        the modules with other logging that price Lightning's logging
    report.py, plots.py          the table, the JSON record, the PNGs
    gpu.sh                       the GPU checks in one call (tests marked gpu, `--gpu`, fsdp_memory on the CPU)
"""
