"""DataParallel in one process: `python -m project.optional.reference.dp [overrides]`.

Compared with `single`: wrap the network in `nn.DataParallel` over the first `trainer.devices` GPUs (all of them
for "auto"). Each forward pass then splits the batch along dim 0 between the GPUs and gathers the outputs on the
first one, where the loss is computed and the gradients summed. The checkpoint saves `model.module`, the bare
network, so its keys carry no `module.` prefix.
"""

import torch
from omegaconf import DictConfig
from torch import nn

from project.engine.errors import exit_on_user_error, run_hydra_app
from project.engine.history import TrainingHistory
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main
from project.optional.reference.loop import Trainer, build, fit_and_report, pick_device


def gpu_ids(devices: int | str | list) -> list[int]:
    """`trainer.devices` as GPU indices: "auto" or -1 is every GPU, N the first N, a list itself."""
    if isinstance(devices, int) and devices > 0:
        return list(range(devices))
    if devices in ("auto", -1):
        return list(range(torch.cuda.device_count()))
    return [int(index) for index in devices]


@hydra_main("../../../conf", "train", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    device = pick_device()
    datamodule, network, optimizer, schedule = build(cfg, device)
    if device.type == "cuda":
        model = nn.DataParallel(network, device_ids=gpu_ids(cfg.trainer.devices))
    else:
        print(f"dp: no GPU here, so DataParallel does not split batches: training on {device}", flush=True)
        model = network
    trainer = Trainer(model, optimizer, schedule, device, TrainingHistory())
    fit_and_report(cfg, trainer, datamodule, datamodule.train_dataloader())


if __name__ == "__main__":
    run_hydra_app(main)
