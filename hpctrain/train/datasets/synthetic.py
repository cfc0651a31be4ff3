"""Synthetic data sets with a learnable signal.

Each builder returns a :class:`Splits` of :class:`TensorData`. ``TensorData`` implements
``__getitems__`` so a DataLoader fetches a whole micro-batch with one indexing operation instead of
stacking single samples (that keeps the input pipeline off the step time).
"""

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset


class TensorData(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        assert len(x) == len(y)
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def __getitems__(self, indices: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        idx = indices if isinstance(indices, torch.Tensor) else torch.as_tensor(indices)  # the sampler's tensor as is
        return self.x[idx], self.y[idx]

    @staticmethod
    def collate(batch: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return batch  # __getitems__ already returns the batch


@dataclass
class Splits:
    train: Dataset
    val: Optional[Dataset] = None


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gaussian_classes(
    num_features: int, num_classes: int, train_size: int, val_size: int, noise: float = 1.0, seed: int = 1234
) -> Splits:
    g = _gen(seed)
    centres = torch.randn(num_classes, num_features, generator=g) * 1.5

    def draw(n: int) -> TensorData:
        y = torch.randint(num_classes, (n,), generator=g)
        x = centres[y] + noise * torch.randn(n, num_features, generator=g)
        return TensorData(x, y)

    return Splits(draw(train_size), draw(val_size))


def smooth_regression(
    num_features: int, num_targets: int, train_size: int, val_size: int, noise: float = 0.1, seed: int = 1234,
    num_classes: Optional[int] = None,
) -> Splits:
    """Float targets ``sin(x @ w)`` per target value: ``(N,)`` for one target, ``(N, num_targets)`` for more.

    ``num_classes`` is the config's output count (models read it); it must equal ``num_targets``."""
    if num_classes is not None and num_classes != num_targets:
        raise ValueError(f"data.num_classes={num_classes}: a regression has one output per target value, "
                         f"expected data.num_targets={num_targets}")
    g = _gen(seed)
    weights = torch.randn(num_features, num_targets, generator=g) / num_features**0.5

    def draw(n: int) -> TensorData:
        x = torch.randn(n, num_features, generator=g)
        y = torch.sin(2.0 * (x @ weights)) + noise * torch.randn(n, num_targets, generator=g)
        return TensorData(x, y.squeeze(-1) if num_targets == 1 else y)

    return Splits(draw(train_size), draw(val_size))


def square_images(
    image_size: int, channels: int, num_classes: int, train_size: int, val_size: int, noise: float = 0.5,
    seed: int = 1234, num_features: Optional[int] = None,
) -> Splits:
    """Class k: a bright square in region k of a vertical split of the image.

    ``num_features`` is the config's flat size (for models that take vectors); it must match the shape."""
    if num_features is not None and num_features != channels * image_size * image_size:
        raise ValueError(f"data.num_features={num_features}: expected channels x image_size x image_size = "
                         f"{channels * image_size * image_size}")
    g = _gen(seed)
    side = max(2, image_size // 4)

    def draw(n: int) -> TensorData:
        y = torch.randint(num_classes, (n,), generator=g)
        x = noise * torch.randn(n, channels, image_size, image_size, generator=g)
        band = image_size // num_classes
        cols = y * band + torch.randint(0, max(1, band - side + 1), (n,), generator=g)
        rows = torch.randint(0, image_size - side + 1, (n,), generator=g)
        for i in range(n):  # cheap: done once at start-up
            r, c = int(rows[i]), min(int(cols[i]), image_size - side)
            x[i, :, r : r + side, c : c + side] += 2.0
        return TensorData(x, y)

    return Splits(draw(train_size), draw(val_size))


def markov_tokens(
    vocab_size: int, seq_len: int, train_size: int, val_size: int, branching: int = 4, seed: int = 1234
) -> Splits:
    """Sequences from a Markov chain where each token has ``branching`` likely successors.

    Inputs are tokens[:-1], targets tokens[1:]; the best achievable loss is about log(branching).
    """
    g = _gen(seed)
    successors = torch.stack([torch.randperm(vocab_size, generator=g)[:branching] for _ in range(vocab_size)])

    def draw(n: int) -> TensorData:
        seq = torch.empty(n, seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(vocab_size, (n,), generator=g)
        for t in range(seq_len):
            choice = torch.randint(branching, (n,), generator=g)
            seq[:, t + 1] = successors[seq[:, t], choice]
        return TensorData(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())

    return Splits(draw(train_size), draw(val_size))
