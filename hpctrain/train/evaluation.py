"""Validation: built-in metric functions, the eval pass, and the sample-weighted mean over micro-batches and ranks.

A metric is any callable ``(outputs, targets) -> tensor``: ``outputs`` are the model's predictions
(see ``model_outputs.logits_of``), the result is the batch's mean (a scalar) or one value per sample.
"""

import contextlib
from typing import Any, Callable, Dict

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hpctrain.train.batches import batch_size_of, to_device
from hpctrain.train.distributed import DistInfo
from hpctrain.train.forward import Forward
from hpctrain.train.outputs import ModelOutputError, logits_of


class MetricError(RuntimeError):
    """A metric raised or returned something that is not a number."""


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Top-1 accuracy: class scores ``(..., C)`` against integer targets ``(...)`` (an LM: per token)."""
    if outputs.dim() < 2 or outputs.shape[:-1] != targets.shape or targets.is_floating_point():
        raise ValueError(f"expected class scores (..., C) and integer targets (...), got outputs of shape "
                         f"{tuple(outputs.shape)} and {targets.dtype} targets of shape {tuple(targets.shape)}")
    return (outputs.argmax(-1) == targets).float().mean()


def batch_value(name: str, fn: Callable[..., Any], outputs: Any, targets: Any) -> torch.Tensor:
    """One batch's mean of metric ``name``, as a float scalar on the outputs' device; one-line errors."""
    try:
        value = fn(outputs, targets)
        return torch.as_tensor(value, device=outputs.device).float().mean()
    except Exception as exc:  # the user's code: say which metric and what it should be
        what = getattr(fn, "__qualname__", type(fn).__name__)
        raise MetricError(f"metrics.{name} ({what}) raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                          f"; expected a callable (outputs, targets) -> tensor") from exc


def weighted_means(totals: torch.Tensor, names: list) -> Dict[str, float]:
    """``totals`` = per-name sums of batch means x batch sizes, then the sample count: exact means."""
    values = totals.tolist()  # the eval's one host sync
    count = max(values[-1], 1.0)
    return {name: v / count for name, v in zip(names, values[:-1])}


@torch.no_grad()
def evaluate(model: nn.Module, val_set: Dataset, forward: Forward, metric_fns: Dict[str, Callable[..., Any]],
             micro_bs: int, info: DistInfo, autocast: Callable[[], contextlib.AbstractContextManager],
             max_batches: int = 20) -> Dict[str, float]:
    """``val/loss`` and ``val/<metric>``: sample-weighted means over the same samples at any world size:
    the first ``max_batches`` global micro-batches of ``val_set`` (0: all of it)."""
    device = info.device
    size = len(val_set)  # type: ignore[arg-type]  # map-style data sets are sized
    n = size if max_batches <= 0 else min(size, max_batches * micro_bs * info.world_size)
    loader = DataLoader(val_set, batch_size=micro_bs, sampler=list(range(info.rank, n, info.world_size)),
                        collate_fn=getattr(val_set, "collate", None), pin_memory=device.type == "cuda")
    names = ["val/loss"] + [f"val/{name}" for name in metric_fns]
    totals = torch.zeros(len(names) + 1, device=device)  # sums of batch means x batch sizes, count
    for batch in loader:
        batch = to_device(batch, device)
        with autocast():
            outputs, targets = forward(model, batch)
            values = [forward.loss_of(outputs, targets, batch).float()]
        if metric_fns:
            first = f"metrics.{next(iter(metric_fns))}"
            if targets is None:
                raise ModelOutputError(f"{first}: the batch has no targets (a dict batch needs 'labels')")
            preds = logits_of(outputs, first)
            values += [batch_value(name, fn, preds, targets) for name, fn in metric_fns.items()]
        totals += torch.stack(values + [torch.ones((), device=device)]) * batch_size_of(batch)
    if info.enabled:
        dist.all_reduce(totals)  # every rank's sums: one collective per eval
    return weighted_means(totals, names)
