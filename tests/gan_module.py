"""Modules whose training leaves some of their parameters out of a loss, as GANs, multi-task heads and frozen
branches do: DDP then needs `trainer.strategy.find_unused_parameters=true` (tests/test_unused_parameters.py).

- `TinyGAN`: a generator and a discriminator, two optimizers, manual optimisation. Each step trains one of them with
  the other's parameters switched off (`toggle_optimizer`), as Lightning's own GAN example does.
- `UnusedHead`: automatic optimisation, one loss, and a second head that no loss reaches.
Both train on tests/foreign_modules.py's `RegressionData` (the targets are the GAN's "real" samples).
"""

import lightning as L
import torch
from torch import Tensor, nn

NOISE = 4


class TinyGAN(L.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.01) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.lr = lr
        self.generator = nn.Sequential(nn.Linear(NOISE, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.discriminator = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def _discriminator_loss(self, real: Tensor, fake: Tensor) -> Tensor:
        scores = self.discriminator(torch.cat([real, fake]))
        labels = torch.cat([torch.ones_like(real), torch.zeros_like(fake)])
        return nn.functional.binary_cross_entropy_with_logits(scores, labels)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        generator_optimizer, discriminator_optimizer = self.optimizers()
        real = batch[1]
        noise = torch.randn(len(real), NOISE, device=real.device)

        self.toggle_optimizer(discriminator_optimizer)
        discriminator_loss = self._discriminator_loss(real, self.generator(noise).detach())
        discriminator_optimizer.zero_grad()
        self.manual_backward(discriminator_loss)
        discriminator_optimizer.step()
        self.untoggle_optimizer(discriminator_optimizer)

        self.toggle_optimizer(generator_optimizer)
        scores = self.discriminator(self.generator(noise))
        generator_loss = nn.functional.binary_cross_entropy_with_logits(scores, torch.ones_like(scores))
        generator_optimizer.zero_grad()
        self.manual_backward(generator_loss)
        generator_optimizer.step()
        self.untoggle_optimizer(generator_optimizer)
        losses = {"train/d_loss": discriminator_loss, "train/g_loss": generator_loss}
        self.log_dict(losses, on_step=False, on_epoch=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        real = batch[1]
        fake = self.generator(torch.randn(len(real), NOISE, device=real.device))
        self.log("val/d_loss", self._discriminator_loss(real, fake), sync_dist=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        real = batch[1]
        fake = self.generator(torch.randn(len(real), NOISE, device=real.device))
        self.log("test/d_loss", self._discriminator_loss(real, fake), sync_dist=True)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.generator.parameters(), lr=self.lr),
            torch.optim.Adam(self.discriminator.parameters(), lr=self.lr),
        ]


class UnusedHead(L.LightningModule):
    """A regression with a second head (say, an auxiliary task switched off) that its loss never reaches."""

    def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.body = nn.Sequential(nn.Linear(1, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 1)
        self.auxiliary_head = nn.Linear(hidden, 1)

    def _mse(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.head(self.body(inputs)), targets)
        self.log(f"{stage}/mse", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._mse(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._mse(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._mse(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)
