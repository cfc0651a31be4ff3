"""Batches as data sets give them: ``(inputs, targets)`` pairs or dicts in Hugging Face's convention.

Pairs' targets are tensors or Python numbers (torchvision's int labels; the default collate makes a
tensor of them). Dicts (``{"input_ids": ..., "labels": ...}``) are moved key by key.
"""

from collections.abc import Mapping
from typing import Any, Iterator

import torch


def _move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value  # already there (a CPU run): what .to() returns, without its dispatch a batch
        # async only from pinned host memory to a GPU; anything else is a synchronous copy anyway
        return value.to(device, non_blocking=device.type == "cuda")
    if isinstance(value, (int, float)):
        return torch.as_tensor(value, device=device)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        return torch.as_tensor(value, device=device)  # a batch of Python-number targets, not collated
    if isinstance(value, Mapping):
        return {k: _move(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device) for v in value)
    return value


def to_device(batch: Any, device: torch.device) -> Any:
    """A pair with its tensors (and number targets, as a tensor) on ``device``, or a dict moved key by key."""
    if type(batch) is tuple and len(batch) == 2:  # the common pair first: no ABC check a step
        x, y = batch
        if type(x) is torch.Tensor and type(y) is torch.Tensor and x.device == device and y.device == device:
            return batch  # two tensors already there (a CPU run): what _move gives, without its two calls a step
        return _move(x, device), _move(y, device)
    if isinstance(batch, Mapping):
        return {k: _move(v, device) for k, v in batch.items()}
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"data: a batch is a {type(batch).__name__}; expected (inputs, targets) pairs or dicts "
                        f"in Hugging Face's convention (input_ids, labels, ...)")
    x, y = batch
    return _move(x, device), _move(y, device)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def check_on_device(host: Any, moved: Any, device: torch.device) -> None:
    """Raise unless every tensor of ``moved`` is on ``device`` and, on a GPU, ``host``'s tensors are pinned
    (a non_blocking copy from pageable memory is silently synchronous)."""
    wrong = {str(t.device) for t in _tensors(moved) if t.device != device}
    if wrong:
        raise RuntimeError(f"data: a batch has tensors on {sorted(wrong)} after moving it to {device}; "
                           f"expected every tensor on {device} (a batch type the trainer cannot move?)")
    if device.type == "cuda" and not all(t.is_pinned() or t.device.type == "cuda" for t in _tensors(host)):
        raise RuntimeError("data: the DataLoader gave batch tensors outside pinned memory although pin_memory=True; "
                           "expected tuples, lists or dicts of tensors (or a batch type with .pin_memory())")


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its targets (pairs) or of its first tensor (dicts)."""
    if isinstance(batch, Mapping):
        first = next((v for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
        return int(first.shape[0]) if first is not None else 1
    x, y = batch
    ref = y if isinstance(y, torch.Tensor) and y.dim() > 0 else x
    return int(ref.shape[0]) if isinstance(ref, torch.Tensor) and ref.dim() > 0 else 1


def tokens_per_sample(sample: Any) -> int:
    """Tokens in one sample for throughput: the target length when targets are integer sequences, else 1."""
    target = sample.get("labels") if isinstance(sample, Mapping) else sample[1]
    if target is None:
        return 1
    t = torch.as_tensor(target)
    integer = not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)
    return t.numel() if integer and t.dim() >= 1 else 1
