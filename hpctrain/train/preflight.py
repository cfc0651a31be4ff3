"""One forward pass on a few training samples before step 0: the shapes a model and its data must agree on.

A model built for 4 classes on data with labels up to 7 trains until the loss raises ``IndexError: Target 6
is out of bounds`` (in the first step, on every attempt); a regression whose metrics still hold ``accuracy``
fails at the first eval, mid-training. Both are found here, in a second, with one line naming the keys.
The pass uses no randomness of the run (RNG forked and put back) and no gradients.
"""

from typing import Any, Callable, Dict, Optional

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import default_collate

from hpctrain.train import losses
from hpctrain.train.batches import to_device
from hpctrain.train.evaluation import MetricError, batch_value
from hpctrain.train.forward import Forward
from hpctrain.train.outputs import logits_of

SAMPLES = 4


def check(cfg: DictConfig, model: nn.Module, forward: Forward, train_set: Any,
          metric_fns: Dict[str, Callable[..., Any]], device: torch.device) -> None:
    """Raise ValueError (one line naming both keys) where the model's outputs cannot meet the data's targets."""
    n = min(SAMPLES, len(train_set))
    if n == 0:
        return
    batch = to_device(default_collate([train_set[i] for i in range(n)]), device)
    devices = [device.index] if device.type == "cuda" and device.index is not None else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        was_training = model.training
        model.eval()
        try:
            outputs, targets = forward(model, batch)
        finally:
            model.train(was_training)
    if forward.model_loss or not isinstance(targets, torch.Tensor):
        return  # the model computes its own loss (and knows its shapes), or targets we cannot read
    preds = logits_of(outputs, "the model's output")
    model_key, data_key = f"model._target_={cfg.model.get('_target_')}", f"data._target_={cfg.data.get('_target_')}"
    if forward.loss is losses.cross_entropy and not targets.is_floating_point():
        classes, top = int(preds.shape[-1]), int(targets.max())
        if top >= classes or int(targets.min()) < 0:
            raise ValueError(f"{model_key} gives {classes} class score(s) per sample, but {data_key} has class "
                             f"labels up to {top}: set model.num_classes{_now(cfg.model, 'num_classes')} to the "
                             f"data's classes (data.num_classes{_now(cfg.data, 'num_classes')})")
    if forward.loss is losses.mse and preds.numel() != targets.numel():
        raise ValueError(f"loss=mse: {model_key} gives outputs of shape {tuple(preds.shape)}, {data_key} targets of "
                         f"shape {tuple(targets.shape)}: a regression model needs one output per target value")
    for name, fn in metric_fns.items():
        try:
            batch_value(name, fn, preds, targets)  # a metric that cannot score this data fails here, not mid-run
        except MetricError as exc:
            if name != "accuracy" or not targets.is_floating_point():
                raise
            raise MetricError(f"{exc}; a regression ({data_key}: float targets) has no accuracy: drop it with "
                              f"~metrics.accuracy") from None


def _now(node: Optional[DictConfig], key: str) -> str:
    value = node.get(key) if node is not None else None
    return f" (now {value})" if value is not None else ""
