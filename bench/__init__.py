"""The benchmark suite: `python -m bench [--quick] [--gpu]` (or `make bench`).

Each suite measures its candidates side by side in one process, in interleaved repeats, so that a slower moment
of the machine hits every candidate alike; ratios are medians of per-repeat ratios, with their range. One table
goes to stdout; `bench/results/<date>.json` and PNG plots record the run.

A suite is a module `bench/<name>.py` named in `__main__.py`'s lists, imported only when it runs, with:
    run(settings, recipe, scratch) -> dict    measures (`recipe`: the `experiment=mnist` overrides; `scratch`: its
                                              own empty folder) and returns its JSON-ready result
    rows(result) -> list[report.Row]          its rows of the table
and, where it has them:
    details(result) -> list[str]              free-form lines under the table
    panels(result) -> list[plots.Panel]       its panels of the shared `<stem>-throughput.png`
    draw(result, out, stem) -> list[Path]     its own figures, written into `out`
An optional part's suite is deleted with its part (project/optional/parts.yaml); a run leaves it out and says so.

The suites (in brackets, the optional part a file goes with):
    data_path.py          epoch time of the data paths against the compute-only loop (the limit)
    lightning_overhead.py the default Lightning path against the reference loop, and where the time goes (reference)
    startup.py            `python -m project.train` on the toy against the bare imports
    ddp_scaling.py        gloo DDP on the CPU: 2 processes against 1
    preemption.py         a run stopped by SIGTERM mid-epoch and resumed (mid_epoch)
    memory.py             peak resident memory of a run against the bare imports
    sweep_leaks.py        threads, files, child processes and memory after jobs 1, 50 and 200 of a toy sweep
    side_by_side.py       the README's side-by-side sweep against one at a time: toy and recipe jobs (parallel)
    fsdp_memory.py        per-rank model state and memory under FSDP against DDP, an MLP and a GPT (fsdp)
    image_folder.py       `data=image_folder`'s loader against decoding and training (image_folder)
    time_to_accuracy.py   the `experiment=mnist` recipe on Fashion-MNIST: epochs and seconds to 85 %, 88 %, best
    gpu.py                the GPU variant (`--gpu`): bf16-mixed and `trainer=dp` against the reference (reference)
What they share:
    settings.py, dataset.py      the run's size and device; where the data is (and its small `--quick` copy)
    training_runs.py             the Lightning path on one composed config, timed per epoch
    reference_runs.py            the reference loop, timed the same way (reference)
    timing.py                    interleaved repeats and their statistics
    profile_costs.py             a profile split into named parts (reference)
    lightning_variants.py        the modules with other logging that price Lightning's logging (reference)
    report.py, plots.py          the table's frame, the JSON record, the figures' shared parts
    gpu.sh                       the GPU checks in one call (tests marked gpu, `--gpu`, fsdp_memory on the CPU)
"""
