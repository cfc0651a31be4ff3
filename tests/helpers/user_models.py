"""A user's own modules, outside the hpctrain package (tests put this folder on PYTHONPATH)."""

import atexit
import os
from pathlib import Path

import torch
from torch import nn


class TinyNet(nn.Module):
    """A user's model with its own constructor arguments."""

    def __init__(self, in_features: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, width), nn.Tanh(), nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class RankDump(TinyNet):
    """Writes this rank's final weights to ``<dump_dir>/rank<R>.pt`` when the process exits."""

    def __init__(self, in_features: int, num_classes: int, dump_dir: str) -> None:
        super().__init__(in_features, num_classes)
        rank = os.environ.get("RANK", "0")
        path = Path(dump_dir) / f"rank{rank}.pt"
        atexit.register(lambda: torch.save({k: v.detach().clone() for k, v in self.state_dict().items()}, path))


class Boom(TinyNet):
    """Fails on every attempt."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("Boom: this model always fails")


class Flaky(TinyNet):
    """Fails on its first attempt only (an attempt is marked by a file in ``marker_dir``)."""

    def __init__(self, in_features: int, num_classes: int, marker_dir: str) -> None:
        super().__init__(in_features, num_classes)
        marker = Path(marker_dir) / "flaky-attempted"
        self.first_attempt = not marker.exists()
        marker.touch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first_attempt:
            raise RuntimeError("Flaky: failing on the first attempt")
        return super().forward(x)


def sign_data(num_features: int, num_classes: int, train_size: int, seed: int = 0) -> torch.utils.data.Dataset:
    """A user's own data set (a plain Dataset): the class is the sign of the first feature."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(train_size, num_features, generator=g)
    y = (x[:, 0] > 0).long() % num_classes
    return torch.utils.data.TensorDataset(x, y)


class RankOneFails(TinyNet):
    """Rank 1 raises on its first step; rank 0 would wait in the gradient all-reduce for it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            raise RuntimeError("RankOneFails: rank 1 is out")
        return super().forward(x)
