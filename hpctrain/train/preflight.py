"""One forward pass on a few training samples before step 0: the shapes a model and its data must agree on.

A model built for 4 classes on data with labels up to 7 trains until the loss raises ``IndexError: Target 6
is out of bounds`` (in the first step, on every attempt); a regression loss on class labels, or a class loss
on float targets, cannot learn. Both are found here, in a second, with one line naming the keys. The
built-in accuracy, on by default for classification sets, applies only where there are classes: on a
regression's float targets it is left out (said in one line) instead of failing at the first eval.
The pass uses no randomness of the run (RNG forked and put back) and no gradients.
"""

import inspect
import logging
from typing import Any, Callable, Dict, Optional

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import default_collate

from hpctrain.train import losses
from hpctrain.train.batches import to_device
from hpctrain.train import evaluation
from hpctrain.train.evaluation import MetricError, batch_value
from hpctrain.train.forward import Forward
from hpctrain.train.outputs import logits_of

log = logging.getLogger(__name__)

SAMPLES = 4


def check(cfg: DictConfig, model: nn.Module, forward: Forward, train_set: Any,
          metric_fns: Dict[str, Callable[..., Any]], device: torch.device) -> Dict[str, Callable[..., Any]]:
    """The metrics that apply to this data; ValueError (one line naming both keys) where the model's outputs
    cannot meet the data's targets."""
    n = min(SAMPLES, len(train_set))
    if n == 0:
        return metric_fns
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
        return metric_fns  # the model computes its own loss (and knows its shapes), or targets we cannot read
    preds = logits_of(outputs, "the model's output")
    model_key, data_key = f"model._target_={cfg.model.get('_target_')}", f"data._target_={cfg.data.get('_target_')}"
    regression = targets.is_floating_point()
    if forward.loss is losses.cross_entropy and regression:
        raise ValueError(f"loss=cross_entropy (the default) needs integer class labels, but {data_key} has float "
                         f"targets (a regression): add loss=mse, or loss._target_=<your regression loss>")
    if forward.loss is losses.cross_entropy:
        classes, top = int(preds.shape[-1]), int(targets.max())
        if top >= classes or int(targets.min()) < 0:
            raise ValueError(f"{model_key} gives {classes} class score(s) per sample, but {data_key} has class "
                             f"labels up to {top}: {_class_advice(cfg, model, top + 1)}")
    if forward.loss is losses.mse and preds.numel() != targets.numel():
        if not regression:
            raise ValueError(f"loss=mse is a regression loss, but {data_key} has integer class labels and {model_key} "
                             f"gives {tuple(preds.shape)} outputs for {tuple(targets.shape)} targets: use "
                             f"loss=cross_entropy for classes, or a data set with float targets (data=regression)")
        raise ValueError(f"loss=mse: {model_key} gives outputs of shape {tuple(preds.shape)}, {data_key} targets of "
                         f"shape {tuple(targets.shape)}: a regression model needs one output per target value")
    applies = dict(metric_fns)
    if regression and applies.get("accuracy") is evaluation.accuracy:
        if cfg.objective.metric == "val/accuracy":
            raise ValueError(f"objective.metric=val/accuracy: {data_key} has float targets (a regression), which "
                             f"have no accuracy; expected objective.metric=val/loss or another val/<metric>")
        del applies["accuracy"]  # on by default for classification sets; a regression has no classes
        log.info("metrics.accuracy left out: %s has float targets (a regression has no classes)", data_key)
    for name, fn in applies.items():
        try:
            batch_value(name, fn, preds, targets)  # a metric that cannot score this data fails here, not mid-run
        except MetricError as exc:
            if name != "accuracy" or not regression:
                raise
            raise MetricError(f"{exc}; a regression ({data_key}: float targets) has no accuracy: drop it with "
                              f"~metrics.accuracy") from None
    return applies


def _class_advice(cfg: DictConfig, model: nn.Module, needed: int) -> str:
    """How to make the model's class scores meet the data's labels, naming only keys the model takes."""
    where = f"the data's classes (data.num_classes{_now(cfg.data, 'num_classes')})" \
        if cfg.data is not None and "num_classes" in cfg.data else f"at least {needed}"
    try:
        takes = "num_classes" in inspect.signature(type(model)).parameters
    except (TypeError, ValueError):
        takes = False
    if takes and cfg.model is not None and "num_classes" in cfg.model:
        return f"set model.num_classes{_now(cfg.model, 'num_classes')} to {where}"
    return f"make the model's last layer give {where} scores per sample (model._target_ has no num_classes key)"


def _now(node: Optional[DictConfig], key: str) -> str:
    value = node.get(key) if node is not None else None
    return f" (now {value})" if value is not None else ""
