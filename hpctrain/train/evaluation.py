"""Validation metrics: built-in metric functions, and the sample-weighted mean over micro-batches and ranks.

A metric is any callable ``(outputs, targets) -> tensor``: ``outputs`` are the model's predictions
(see ``model_outputs.logits_of``), the result is the batch's mean (a scalar) or one value per sample.
"""

from typing import Any, Callable, Dict

import torch


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
