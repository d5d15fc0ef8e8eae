"""The plain networks, shared by the Lightning path (`project.module`) and the raw path (`project.reference`).

They are ordinary `nn.Module`s on purpose: neither path may carry its own copy, so any difference in results
between the two paths comes from the training plumbing, never from the model.
"""

from torch import Tensor, nn


class NeuralNetwork(nn.Module):
    """The toy classifier of the DDP tutorial: inputs → 30 → 20 → outputs, ReLU between layers."""

    def __init__(self, num_inputs: int, num_outputs: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(num_inputs, 30),
            nn.ReLU(),
            nn.Linear(30, 20),
            nn.ReLU(),
            nn.Linear(20, num_outputs),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class DeepNeuralNetwork(nn.Module):
    """The MNIST MLP of the Slurm tutorial: `num_layers` Linear layers with ReLU between, none after the last.

    Layers: input → hidden, (num_layers - 2) × hidden → hidden, hidden → classes. Images `[B, 1, 28, 28]` are
    flattened to `[B, 784]` first, so it takes the data modules' batches as they come.
    """

    def __init__(self, num_layers: int, input_features: int, num_hidden_features: int, num_classes: int) -> None:
        super().__init__()
        if num_layers < 2:
            raise ValueError(f"DeepNeuralNetwork needs num_layers >= 2 (input and output layer), got {num_layers}")
        widths = [input_features] + [num_hidden_features] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in zip(widths[:-1], widths[1:], strict=True))

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(start_dim=1)
        for layer in self.layers[:-1]:
            x = nn.functional.relu(layer(x))
        return self.layers[-1](x)
