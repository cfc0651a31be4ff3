"""This rank's training micro-batches: the sharded order, one batch fetched ahead, the resumable data position."""

from typing import Any, Dict, Iterator, Optional, Sized, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from hpctrain.train.batches import check_on_device, to_device
from hpctrain.train.distributed import DistInfo


class ShardedBatches(Sampler):
    """This rank's micro-batches of an epoch, from micro-batch ``skip`` on (the resumable data position).

    DistributedSampler's order: one seeded shuffle per epoch shared by all ranks, trimmed to a multiple
    of the world size, rank r taking every world_size-th index from r. So the ranks' micro-batches b
    together are the same samples whatever the world size. Batches come out as index tensors, which a
    data set with ``__getitems__`` takes in one indexing operation (lists of ints for any other).
    """

    def __init__(self, dataset: Dataset, info: DistInfo, seed: int, micro_bs: int) -> None:
        self.n, self.rank, self.world = len(cast(Sized, dataset)), info.rank, info.world_size
        self.seed, self.micro_bs = seed, micro_bs
        self.per_rank = self.n // self.world
        self.batches_per_epoch = self.per_rank // micro_bs
        self.as_tensor = hasattr(dataset, "__getitems__")
        self.epoch, self.skip = 0, 0

    def set_position(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def __iter__(self) -> Iterator[Any]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        mine = torch.randperm(self.n, generator=g)[: self.per_rank * self.world][self.rank :: self.world]
        for b in range(self.skip, self.batches_per_epoch):
            batch = mine[b * self.micro_bs : (b + 1) * self.micro_bs]
            yield batch if self.as_tensor else batch.tolist()

    def __len__(self) -> int:
        return self.batches_per_epoch - self.skip


class MicroBatches:
    """Micro-batches forever, on the device; at most one fetched ahead (``prefetch``) while the step runs.

    Stateful: ``(epoch, batch_in_epoch)`` counts the micro-batches handed to training steps, so a state
    taken while a batch waits fetched ahead would skip it on resume; that raises instead.
    """

    def __init__(self, dataset: Dataset, sampler: ShardedBatches, device: torch.device, num_workers: int,
                 seed: int) -> None:
        self.dataset, self.sampler, self.device = dataset, sampler, device
        self.num_workers, self.seed = num_workers, seed
        self.epoch, self.batch_in_epoch = 0, 0
        self._it: Optional[Iterator[Any]] = None
        self._ahead: Optional[Any] = None
        self._checked = False

    def _loader(self) -> DataLoader:
        return DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            num_workers=self.num_workers,
            pin_memory=self.device.type == "cuda",  # page-locked host memory: the copy to the GPU can be async
            collate_fn=getattr(self.dataset, "collate", None),
            # its own generator: an iterator must not draw from the global RNG (a resume would then differ)
            generator=torch.Generator().manual_seed(self.seed + self.epoch),
        )

    def _in_process(self) -> Iterator[Any]:
        """What a DataLoader without workers or pinning yields, without its per-batch machinery (its fetcher,
        a profiler range a batch): the data set's ``__getitems__`` (else one item at a time), then collate."""
        fetch = getattr(self.dataset, "__getitems__", None)
        collate = getattr(self.dataset, "collate", None) or default_collate
        for index in self.sampler:
            yield collate(fetch(index) if fetch else [self.dataset[i] for i in index])

    def _fetch(self) -> Any:
        # the next host batch and its move, in one frame a micro-batch
        while True:
            if self._it is None:
                self.sampler.set_position(self.epoch, self.batch_in_epoch)
                # no workers, nothing to pin: the batches in this process, as the DataLoader would make them
                in_process = self.num_workers == 0 and self.device.type != "cuda"
                self._it = self._in_process() if in_process else iter(self._loader())
            try:
                host = next(self._it)
            except StopIteration:
                self.epoch, self.batch_in_epoch, self._it = self.epoch + 1, 0, None
                continue
            self.batch_in_epoch += 1
            break
        batch = to_device(host, self.device)
        if not self._checked:  # once: a wrong device or unpinned memory on the untested GPU path fails here
            check_on_device(host, batch, self.device)
            self._checked = True
        return batch

    def prefetch(self) -> None:
        """Fetch the next micro-batch now (its host work overlaps the device's queued forward pass)."""
        if self._ahead is not None:
            raise RuntimeError("a micro-batch is already fetched ahead: prefetch() twice without take()")
        self._ahead = self._fetch()

    def take(self) -> Any:
        """The next micro-batch: the one fetched ahead, else one fetched now."""
        batch, self._ahead = (self._ahead if self._ahead is not None else self._fetch()), None
        return batch

    def put_back(self) -> None:
        """Forget the micro-batch fetched ahead, if any: the data position is again at it (a stop between steps)."""
        if self._ahead is not None:
            self._ahead, self._it = None, None  # the next fetch starts a loader at the position
            self.batch_in_epoch -= 1  # never below 0: a fetch that began an epoch counted its batch 1

    def close(self) -> None:
        self._it, self._ahead = None, None  # ends DataLoader workers, if any

    def state_dict(self) -> Dict[str, int]:
        if self._ahead is not None:
            raise RuntimeError(f"data position taken with a micro-batch fetched ahead (epoch {self.epoch}, batch "
                               f"{self.batch_in_epoch}): a resume would skip it; save only at a step boundary")
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.close()
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
