"""`experiment=mnist_slurm`, the Slurm tutorial's job, as it composes."""

from pathlib import Path

from tests.test_config import compose_train


def test_experiment_mnist_slurm_is_the_slurm_tutorials_job(tmp_path: Path):
    """Its network, Adam at 1e-3 with no schedule, batch 128 per rank, 2 epochs, every training image, 2 nodes."""
    cfg = compose_train(tmp_path, "experiment=mnist_slurm")
    network = cfg.model.network
    assert (network.num_layers, network.input_features, network.num_hidden_features, network.num_classes) == (
        4,
        784,
        128,
        10,
    )
    assert cfg.model.optimizer._target_ == "torch.optim.Adam" and cfg.model.optimizer.lr == 1e-3
    assert cfg.model.scheduler is None and "fused" not in cfg.model.optimizer
    assert (cfg.data.batch_size, cfg.data.val_size, cfg.trainer.max_epochs, cfg.trainer.num_nodes) == (128, 0, 2, 2)
