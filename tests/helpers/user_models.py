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


class ThreadCount(TinyNet):
    """Writes the number of threads torch uses in this process to ``<dump_dir>/threads-<pid>.txt``."""

    def __init__(self, in_features: int, num_classes: int, dump_dir: str) -> None:
        super().__init__(in_features, num_classes)
        (Path(dump_dir) / f"threads-{os.getpid()}.txt").write_text(
            f"{torch.get_num_threads()} {os.environ.get('OMP_NUM_THREADS')}")


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


SCALE = 3  # not callable: `loss._target_=user_models.SCALE` is refused on the login node


# ---------------------------------------------------------------- a user's own task (issue 9)
class IntLabelImages(torch.utils.data.Dataset):
    """torchvision's convention: ``(image tensor, int label)``; no ``__getitems__``, the default collate."""

    def __init__(self, n: int, num_classes: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(num_classes, (n,), generator=g).tolist()
        self.images = 0.5 * torch.randn(n, 1, 8, 8, generator=g)
        for i, label in enumerate(self.labels):  # class k: a bright row k
            self.images[i, 0, 2 * label] += 1.5

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])


def int_label_images(num_classes: int, train_size: int, val_size: int, seed: int = 0):
    from types import SimpleNamespace

    return SimpleNamespace(train=IntLabelImages(train_size, num_classes, seed),
                           val=IntLabelImages(val_size, num_classes, seed + 1))


class TinyConv(nn.Module):
    """A torchvision-style classifier: conv, pool, linear."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


class Regression(torch.utils.data.Dataset):
    """y = w.x + noise; targets as Python floats or as float tensors of shape (1,)."""

    def __init__(self, n: int, num_features: int, seed: int, tensor_targets: bool) -> None:
        g = torch.Generator().manual_seed(seed)
        w = torch.linspace(-1, 1, num_features)
        self.x = torch.randn(n, num_features, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(n, generator=g)
        self.tensor_targets = tensor_targets

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        y = self.y[i]
        return self.x[i], (y.reshape(1) if self.tensor_targets else float(y))


def regression_data(num_features: int, train_size: int, val_size: int, tensor_targets: bool = False):
    from types import SimpleNamespace

    return SimpleNamespace(train=Regression(train_size, num_features, 0, tensor_targets),
                           val=Regression(val_size, num_features, 1, tensor_targets))


class Regressor(nn.Module):
    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class DictTokens(torch.utils.data.Dataset):
    """Hugging Face's convention: ``{"input_ids": (T,), "labels": (T,)}``; the next token is the current + 1."""

    def __init__(self, n: int, vocab_size: int, seq_len: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(vocab_size, (n, 1), generator=g)
        self.seq = (start + torch.arange(seq_len + 1)) % vocab_size

    def __len__(self) -> int:
        return len(self.seq)

    def __getitem__(self, i: int):
        return {"input_ids": self.seq[i, :-1], "labels": self.seq[i, 1:]}


def dict_tokens(vocab_size: int = 16, seq_len: int = 8, train_size: int = 1024, val_size: int = 128):
    from types import SimpleNamespace

    return SimpleNamespace(train=DictTokens(train_size, vocab_size, seq_len, 0),
                           val=DictTokens(val_size, vocab_size, seq_len, 1))


class CausalLMOutput(dict):
    """Like transformers' ModelOutput: a dict whose fields are attributes too."""

    __getattr__ = dict.__getitem__


class TinyCausalLM(nn.Module):
    """``model(input_ids=..., labels=...)`` returns ``.loss`` and ``.logits``, in plain torch."""

    def __init__(self, vocab_size: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 32)
        self.head = nn.Linear(32, vocab_size)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor = None) -> CausalLMOutput:
        logits = self.head(torch.tanh(self.embed(input_ids)))
        out = CausalLMOutput(logits=logits)
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


class LogitsAndLoss(TinyNet):
    """nanoGPT's convention: ``model(x, targets)`` returns ``(logits, loss)``."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor = None):
        logits = super().forward(x)
        loss = None if targets is None else torch.nn.functional.cross_entropy(logits, targets)
        return logits, loss


def broken_metric(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    raise KeyError("no such column")


class IgnoresTargets(TinyNet):
    """Takes the targets but returns logits only: no loss for loss=model."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor = None) -> torch.Tensor:
        return super().forward(x)


class SlowDropout(TinyNet):
    """Dropout (so a resume must restore the RNG) and ``delay_s`` of sleep per training forward, so a test
    can kill the run between two checkpoints without thousands of steps."""

    def __init__(self, in_features: int, num_classes: int, delay_s: float = 0.01,
                 first_attempt_only: bool = False) -> None:
        super().__init__(in_features, num_classes)
        self.drop = nn.Dropout(0.2)
        # first_attempt_only: no sleep once Slurm has requeued the job (the rest of the run goes fast)
        requeued = int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0
        self.delay_s = 0.0 if first_attempt_only and requeued else delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.delay_s:
            import time

            time.sleep(self.delay_s)
        return self.body(self.drop(x))


class SlowSave(TinyNet):
    """A final save that takes ``delay_s`` (its ``state_dict`` sleeps, once ``marker`` is written), so a
    test can signal the job while the run saves its last checkpoint."""

    def __init__(self, in_features: int, num_classes: int, marker: str, delay_s: float = 20.0) -> None:
        super().__init__(in_features, num_classes)
        self.marker, self.delay_s = marker, delay_s

    def state_dict(self, *args, **kwargs):
        import time

        if os.environ.get("SLURM_JOB_ID") and not os.path.exists(self.marker):  # the job's first (final) save
            with open(self.marker, "a") as f:
                f.write(f"saving at {time.time()}\n")
            time.sleep(self.delay_s)
        return super().state_dict(*args, **kwargs)


class FourScores(nn.Module):
    """A user's model with a fixed head: four class scores, and no num_classes argument."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.head = nn.Linear(in_features, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def block_forever() -> None:
    """Where a hung rank waits (the frame its stack dump must name)."""
    import time

    while True:
        time.sleep(3600)


class HangsOnce(TinyNet):
    """Rank ``hang_rank`` blocks forever in its training forward of step ``hang_at`` on the first attempt only
    (``marker`` is written before it blocks); ``hang_at=-1``: never. ``pause_s``: instead of forever, that long
    (a run that would go on by itself). ``slow_first_s`` / ``slow_eval_s``: a first training forward and each
    evaluation's first forward that take that long (a compile, a long eval: never a hang)."""

    def __init__(self, in_features: int, num_classes: int, hang_at: int = -1, hang_rank: int = 1, marker: str = "",
                 pause_s: float = 0.0, slow_first_s: float = 0.0, slow_eval_s: float = 0.0) -> None:
        super().__init__(in_features, num_classes)
        self.hang_at, self.hang_rank, self.marker, self.pause_s = hang_at, hang_rank, marker, pause_s
        self.slow_first_s, self.slow_eval_s = slow_first_s, slow_eval_s
        self.steps = 0
        self.was_training = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        if self.training and torch.is_grad_enabled():
            if self.steps == 0 and self.slow_first_s:
                time.sleep(self.slow_first_s)
            rank = int(os.environ.get("RANK", "0"))
            if self.steps == self.hang_at and rank == self.hang_rank and not os.path.exists(self.marker):
                Path(self.marker).write_text(f"rank {rank} blocks at step {self.steps}\n")
                if self.pause_s:
                    time.sleep(self.pause_s)
                else:
                    block_forever()
            self.steps += 1
        elif not self.training and self.was_training and self.slow_eval_s:
            time.sleep(self.slow_eval_s)
        self.was_training = self.training
        return super().forward(x)


class SlowOn(HangsOnce):
    """Sleeps ``slow_s`` extra in each training forward on rank ``slow_rank`` only (a slow GPU or CPU of one
    node: the other ranks wait for it in the gradient all-reduce); ``slow_s=0``: a healthy model. The rest of
    its arguments are HangsOnce's (a run that straggles, or hangs once, or both)."""

    def __init__(self, in_features: int, num_classes: int, slow_s: float = 0.0, slow_rank: int = 1,
                 hang_at: int = -1, hang_rank: int = 1, marker: str = "") -> None:
        super().__init__(in_features, num_classes, hang_at=hang_at, hang_rank=hang_rank, marker=marker)
        self.slow = slow_s if int(os.environ.get("RANK", "0")) == slow_rank else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow and self.training:
            import time

            time.sleep(self.slow)
        return super().forward(x)


class BlocksInInit(TinyNet):
    """Rank ``block_rank``'s constructor blocks forever on the first attempt only (``marker`` is written before it
    blocks): a hang in setup, before the loop's first step (as a stuck file system read or a peer that never
    joins would be)."""

    def __init__(self, in_features: int, num_classes: int, marker: str, block_rank: int = 1) -> None:
        super().__init__(in_features, num_classes)
        rank = int(os.environ.get("RANK", "0"))
        if rank == block_rank and not os.path.exists(marker):
            Path(marker).write_text(f"rank {rank} blocks in its model's constructor\n")
            block_forever()
