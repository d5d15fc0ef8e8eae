"""The plain loop on one device: `python -m project.reference.single [overrides]`.

Everything else in `project/reference/` is this file plus what its strategy needs.
"""

import hydra
from omegaconf import DictConfig

from project.errors import exit_on_user_error
from project.history import TrainingHistory
from project.reference.loop import Trainer, build, collect_results, pick_device, write_outputs


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    device = pick_device()
    datamodule, network, optimizer = build(cfg, device)
    trainer = Trainer(network, optimizer, device, TrainingHistory())
    trainer.fit(datamodule.train_dataloader(), datamodule.val_dataloader(), cfg.trainer.max_epochs)

    trainer.history.save(cfg.run_dir)
    results = collect_results(trainer, trainer.evaluate(datamodule.test_dataloader(), "test"), cfg.run_dir)
    write_outputs(cfg.run_dir, trainer, network, results)


if __name__ == "__main__":
    main()
