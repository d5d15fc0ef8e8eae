"""The plain networks, shared by the Lightning path (`project.example.module`) and the raw path (the reference).

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


class ConvolutionalNetwork(nn.Module):
    """A small CNN for square one-channel images (the MNIST family): two blocks of 3×3 convolution, ReLU and 2×2
    max-pooling (`channels`, then twice as many), then one Linear layer from the pooled features to the classes.

    It shows how a network that is not an MLP plugs in (`model=cnn`): any `nn.Module` that maps a batch of the
    data's samples to class logits works with both paths unchanged.
    """

    def __init__(self, in_channels: int, num_classes: int, channels: int = 16, image_size: int = 28) -> None:
        super().__init__()
        if image_size % 4:
            raise ValueError(
                f"ConvolutionalNetwork pools twice by 2: image_size must be a multiple of 4, got {image_size}"
            )
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(2 * channels * (image_size // 4) ** 2, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(start_dim=1))
