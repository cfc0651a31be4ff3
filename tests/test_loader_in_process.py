"""Micro-batches made in process (no workers, nothing to pin) are the DataLoader's, batch for batch."""

import torch
from torch.utils.data import Dataset

from hpctrain.train.batches import to_device
from hpctrain.train.datasets.synthetic import gaussian_classes
from hpctrain.train.distributed import DistInfo
from hpctrain.train.loader import MicroBatches, ShardedBatches


class Items(Dataset):
    """No ``__getitems__``: the DataLoader fetches item by item and collates with default_collate."""

    def __init__(self, n: int) -> None:
        self.x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], int(i) % 4


def _both(dataset, n_batches: int, info: DistInfo):
    made = MicroBatches(dataset, ShardedBatches(dataset, info, 3, 8), torch.device("cpu"), 0, 3)
    ours = [made._fetch() for _ in range(n_batches)]  # crosses epochs
    loader = MicroBatches(dataset, ShardedBatches(dataset, info, 3, 8), torch.device("cpu"), 0, 3)
    theirs = []
    while len(theirs) < n_batches:  # the DataLoader path, epoch by epoch, as before
        loader.sampler.set_position(loader.epoch, 0)
        theirs += list(iter(loader._loader()))
        loader.epoch += 1
    return ours, [to_device(b, torch.device("cpu")) for b in theirs[:n_batches]]  # the same move


def test_in_process_batches_are_the_data_loader_s():
    tensors = gaussian_classes(4, 3, train_size=100, val_size=10, seed=1).train
    for dataset in (tensors, Items(50)):
        for info in (DistInfo(), DistInfo(rank=1, world_size=2)):
            ours, theirs = _both(dataset, 15, info)
            assert len(ours) == len(theirs) == 15
            for a, b in zip(ours, theirs):
                assert type(a) is type(b) and len(a) == len(b) == 2
                assert all(torch.equal(torch.as_tensor(u), torch.as_tensor(v)) for u, v in zip(a, b))
