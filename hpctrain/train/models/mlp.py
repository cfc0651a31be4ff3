import torch
from torch import nn


class MLP(nn.Module):
    """A plain multi-layer perceptron classifier; images are flattened (``in_features`` = their flat size)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256, depth: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))
