"""Loss functions of the ``loss`` config group, and the loss a model computes itself.

A loss is any callable ``(outputs, targets) -> scalar tensor``; ``build.build_loss`` references a
function by its ``_target_`` (not calling it) and builds a class (``torch.nn.HuberLoss``) with its keys.
"""

from typing import Any

import torch
from torch.nn import functional as F

from hpctrain.train.outputs import logits_of, loss_of


def cross_entropy(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """Class scores ``(N, C)``, or a language model's ``(N, T, C)``, against integer targets ``(N)`` / ``(N, T)``."""
    if type(outputs) is torch.Tensor and outputs.dim() == 2 and targets.dim() == 1:
        return F.cross_entropy(outputs, targets)  # a classifier's (N, C) logits: logits_of's frame saved a step
    logits = logits_of(outputs)
    if logits.dim() == 2 and targets.dim() == 1:
        return F.cross_entropy(logits, targets)  # already (N, C) and (N): two reshapes a step saved
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def mse(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error; targets of the outputs' size are cast and shaped like them ((N,) against (N, 1))."""
    pred = logits_of(outputs)
    if targets.numel() != pred.numel():
        raise ValueError(f"loss=mse: outputs of shape {tuple(pred.shape)} against targets of shape "
                         f"{tuple(targets.shape)}: expected as many target values as outputs")
    return F.mse_loss(pred, targets.to(pred.dtype).view_as(pred))


def from_model(outputs: Any, targets: Any = None) -> torch.Tensor:
    """``loss=model``: the loss the model returned (a scalar, ``(logits, loss)``, ``.loss`` or ``["loss"]``).

    The trainer sees this loss and calls ``model(inputs, targets)`` for pair batches.
    """
    return loss_of(outputs)
