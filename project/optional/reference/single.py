"""The plain loop on one device: `python -m project.optional.reference.single [overrides]`.

Everything else in `project/optional/reference/` is this file plus what its strategy needs.
"""

from omegaconf import DictConfig

from project.engine.errors import exit_on_user_error, run_hydra_app
from project.engine.history import TrainingHistory
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main
from project.optional.reference.loop import Trainer, build, fit_and_report, pick_device, require_one_device


@hydra_main("../../../conf", "train", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    require_one_device(cfg)
    device = pick_device()
    datamodule, network, optimizer, schedule = build(cfg, device)
    trainer = Trainer(network, optimizer, schedule, device, TrainingHistory())
    fit_and_report(cfg, trainer, datamodule, datamodule.train_dataloader())


if __name__ == "__main__":
    run_hydra_app(main)
