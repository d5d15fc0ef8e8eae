"""Lightning against raw PyTorch on one config: `python -m project.optional.reference.compare [train's overrides]`.

docs/reference.md claims that Lightning adds no numerical change; this is how a user checks it on their own config. It
runs `project.train` into `<run_dir>/lightning`, then the reference script that does the same strategy by hand into
`<run_dir>/reference` (each side's output in `<run_dir>/<side>.log`), prints the two side by side with the largest
per-step loss and final weight differences, and writes `comparison.json` and `loss_curves.png` next to them.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from project.engine.config import check_config, command_line_overrides, config_source_arguments
from project.engine.ddp import reserved_port
from project.engine.errors import UserError, exit_on_user_error, run_hydra_app
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main
from project.optional.reference.loop import (
    require_one_device,
    require_the_classifier,
    require_what_the_reference_mirrors,
)
from project.optional.reference.parity import RunOutputs, comparison_rows, max_loss_difference, max_weight_difference


def one_process(cfg: DictConfig, port: int) -> list[str]:
    return [sys.executable]


def one_device(cfg: DictConfig, port: int) -> list[str]:
    require_one_device(cfg)
    return [sys.executable]


def torchrun(cfg: DictConfig, port: int) -> list[str]:
    devices = cfg.trainer.devices
    if not (isinstance(devices, int) and devices >= 1):
        raise UserError(f"compare starts trainer.devices processes under torchrun: set it to a count, not {devices!r}")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={devices}",
        f"--master_port={port}",
    ]


def slurm_not_simulated(cfg: DictConfig, port: int) -> list[str]:
    raise UserError("compare does not simulate trainer=slurm yet; run it on a Slurm cluster")


# The `trainer=` option -> the reference script that does the same by hand, and the command that starts it.
# The command gets a port of its own for torchrun's rendezvous (a fixed one could collide with another run).
REFERENCE_FOR_TRAINER: dict[str, tuple[str, Callable[[DictConfig, int], list[str]]]] = {
    "default": ("single", one_device),
    "cpu": ("single", one_device),
    "gpu": ("single", one_device),
    "dp": ("dp", one_process),
    "ddp": ("ddp", torchrun),
    "ddp_spawn": ("ddp", torchrun),
    "fsdp": ("fsdp", torchrun),
    "slurm": ("slurm", slurm_not_simulated),
}


def figure(value: float) -> str:
    """Six decimals for the losses and accuracies, one for a count in the thousands (samples/s): columns stay apart."""
    return f"{value:.6f}" if abs(value) < 1000 else f"{value:.1f}"


def format_comparison(title: str, comparison: dict) -> str:
    lines = [f"{'':<22}{'lightning':>14}{'reference':>14}{'|diff|':>12}"]
    for name, lightning in comparison["lightning"].items():
        reference = comparison["reference"][name]
        difference = abs(lightning - reference)
        lines.append(f"{name:<22}{figure(lightning):>14}{figure(reference):>14}{difference:>12.2e}")
    lines.append(f"{'max |step loss diff|':<22}{comparison['max_step_loss_diff']:>14.2e}  (rank 0, every step)")
    lines.append(f"{'max |weight diff|':<22}{comparison['max_weight_diff']:>14.2e}  (final network, every tensor)")
    rule = "-" * max(len(line) for line in [title, *lines])
    return "\n".join([rule, title, rule, *lines, rule])


def plot_loss_curves(lightning: Sequence[float], reference: Sequence[float], path: Path) -> None:
    """Both per-step curves on one axis; the reference is dashed so that a perfect overlap still shows both."""
    figure = Figure(figsize=(7, 4), layout="tight")  # a bare Figure renders PNG with Agg; no GUI backend involved
    axes = figure.subplots()
    axes.plot(range(len(lightning)), lightning, label="lightning", linewidth=3, alpha=0.5)
    axes.plot(range(len(reference)), reference, label="reference", linestyle="--", color="black")
    axes.set(xlabel="step", ylabel="training loss (rank 0)", title="Per-step training loss")
    axes.legend()
    figure.savefig(path)


def run_side(side: str, command: list[str], cwd: str, log_path: Path) -> None:
    """Run one side to the end with its output in `log_path`; if it fails, say which side and where to look."""
    print(f"{side}: {shlex.join(command)}\n  log: {log_path}", flush=True)
    with log_path.open("w") as log:
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        status = subprocess.run(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if status != 0:
        reason = failure_reason(log_path.read_text())
        raise UserError(f"the {side} run failed (exit {status}): {reason}; its whole output is in {log_path}")


def failure_reason(output: str) -> str:
    """The line of a failed side's `output` that says why: the run's own `error:` line (which may follow a progress
    bar's on the same line of the shared log), else the last exception line of a traceback, else the last line that
    is not a rule (torchrun ends its failure report with a row of `=`)."""
    lines = output.strip().splitlines()
    errors = [line.rsplit("error: ", 1)[1] for line in lines if "error: " in line]
    if errors:
        return errors[-1]
    exceptions = [line for line in lines if re.match(r"[\w.]*(Error|Exception|Interrupt)(: |$)", line)]
    if exceptions:
        return exceptions[-1]
    said = [line for line in lines if line.strip(" =-")]
    return repr(said[-1]) if said else "it printed nothing"


def require_history_and_checkpoint(cfg: DictConfig) -> None:
    """Fail before training if the Lightning side would not write the history and last.ckpt that compare reads."""
    targets = {str(callback.get("_target_")) for callback in cfg.callbacks.values()}
    if not {"project.engine.history.HistoryCallback", "lightning.pytorch.callbacks.ModelCheckpoint"} <= targets:
        raise UserError("compare reads the history and last.ckpt that callbacks=default writes: drop callbacks=")


def composed_alike(hydra_cfg: DictConfig) -> list[str]:
    """The arguments that make both sides compose the config compare did: its --config-name and --config-dir, and
    every override but the run and sweep dirs, which are compare's to choose (`hydra.searchpath` among them)."""
    chosen_here = ("hydra.run.", "hydra.sweep.")
    overrides = [*OmegaConf.to_container(hydra_cfg.overrides.hydra), *command_line_overrides()]  # ${...} as given
    return config_source_arguments() + [o for o in overrides if not o.lstrip("+~").startswith(chosen_here)]


def differences(lightning: RunOutputs, reference: RunOutputs) -> dict[str, float]:
    """The largest per-step loss and final weight differences; two runs that cannot be lined up (other step counts,
    other tensors) are one line saying so, never a comparison of what does not match."""
    try:
        return {
            "max_step_loss_diff": max_loss_difference(lightning.history.step_losses, reference.history.step_losses),
            "max_weight_diff": max_weight_difference(lightning.weights, reference.weights),
        }
    except ValueError as error:
        raise UserError(f"the two sides trained different runs, which compare cannot line up: {error}") from None


@hydra_main("../../../conf", "train", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    trainer = hydra_cfg.runtime.choices["trainer"]
    if trainer not in REFERENCE_FOR_TRAINER:
        raise UserError(f"compare knows trainer={' | '.join(REFERENCE_FOR_TRAINER)}, not trainer={trainer}")
    script, reference_launcher = REFERENCE_FOR_TRAINER[trainer]
    # A port held for torchrun's rendezvous until the reference side has run; the launcher refuses what it can't run.
    port_holder = reserved_port()
    reference_command = [
        *reference_launcher(cfg, port_holder.getsockname()[1]),
        "-m",
        f"project.optional.reference.{script}",
    ]
    check_config(cfg)
    if cfg.trainer.get("num_nodes", 1) != 1:
        raise UserError(
            f"trainer.num_nodes={cfg.trainer.num_nodes}: compare runs both sides on this one machine; compare with "
            "trainer.num_nodes=1 (and trainer.devices processes)"
        )
    require_the_classifier(cfg)
    require_what_the_reference_mirrors(cfg)
    require_history_and_checkpoint(cfg)
    arguments = composed_alike(hydra_cfg)
    run_dir = Path(cfg.run_dir)
    commands = {
        "lightning": [sys.executable, "-m", "project.train"],
        "reference": reference_command,
    }
    with port_holder:
        for side, command in commands.items():
            side_command = [*command, *arguments, f"hydra.run.dir={run_dir / side}"]
            run_side(side, side_command, hydra_cfg.runtime.cwd, run_dir / f"{side}.log")

    lightning = RunOutputs.read_lightning(run_dir / "lightning")
    reference = RunOutputs.read_reference(run_dir / "reference")
    rows = comparison_rows(lightning, reference)
    comparison = {
        "trainer": trainer,
        "reference_script": f"project.optional.reference.{script}",
        "world_size": {"lightning": lightning.results["world_size"], "reference": reference.results["world_size"]},
        "lightning": {name: value for name, (value, _) in rows.items()},
        "reference": {name: value for name, (_, value) in rows.items()},
        **differences(lightning, reference),
    }
    (run_dir / "comparison.json").write_text(json.dumps(comparison, indent=1))
    plot_loss_curves(lightning.history.step_losses, reference.history.step_losses, run_dir / "loss_curves.png")
    processes = lightning.results["world_size"]
    title = f"Lightning (trainer={trainer}) vs project.optional.reference.{script}, {processes} process(es)"
    print(format_comparison(title, comparison), flush=True)
    print(f"run dir: {run_dir} (comparison.json, loss_curves.png, lightning/, reference/)", flush=True)


if __name__ == "__main__":
    run_hydra_app(main)
