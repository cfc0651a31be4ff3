"""One forward pass and its loss, in the batch conventions hpctrain takes: pairs, or dicts (Hugging Face)."""

import inspect
from collections.abc import Mapping
from typing import Any, Callable, Tuple

import torch
from torch import nn

from hpctrain.train import losses
from hpctrain.train.outputs import ModelOutputError, logits_of, loss_of


class Forward:
    """``model(inputs)`` (``model(inputs, targets)`` with loss=model) for pairs, ``model(**batch)`` for dicts."""

    def __init__(self, loss: Callable[..., Any], loss_target: str, model: nn.Module) -> None:
        self.loss, self.loss_target = loss, loss_target
        # loss=model: pair batches call model(inputs, targets); dict batches take the model's loss with
        # the default cross_entropy too (a Hugging Face model computes it from the batch's labels)
        self.model_loss = loss is losses.from_model
        self.dict_model_loss = self.model_loss or loss is losses.cross_entropy
        self.own_logits = loss in (losses.cross_entropy, losses.mse)  # they call logits_of: not twice a step
        if self.model_loss:
            takes_targets(model, loss_target)

    def __call__(self, model: nn.Module, batch: Any) -> Tuple[Any, Any]:
        """The model's output and the batch's targets (a dict's ``labels``)."""
        if type(batch) is not tuple and isinstance(batch, Mapping):  # a pair skips the ABC check a step
            return model(**batch), batch.get("labels")
        x, y = batch
        return (model(x, y) if self.model_loss else model(x)), y

    def loss_on(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The batch's loss, ``loss_of(*self(model, batch), batch)``; a pair with a built-in loss in one frame."""
        if type(batch) is tuple and self.own_logits:  # the common case: two frames and an ABC check fewer a step
            x, y = batch
            outputs = model(x)
            try:
                return self.loss(outputs, y)  # the built-in loss finds the predictions itself
            except ModelOutputError as exc:
                raise ModelOutputError(f"loss._target_={self.loss_target}: {exc}") from None
        return self.loss_of(*self(model, batch), batch)

    def loss_of(self, outputs: Any, targets: Any, batch: Any) -> torch.Tensor:
        try:
            if self.model_loss or (self.dict_model_loss and type(batch) is not tuple and isinstance(batch, Mapping)):
                return loss_of(outputs)
            if self.own_logits:
                return self.loss(outputs, targets)  # the built-in loss finds the predictions itself
            return self.loss(logits_of(outputs), targets)  # the predictions: a tensor, (logits, ...), .logits
        except ModelOutputError as exc:
            raise ModelOutputError(f"loss._target_={self.loss_target}: {exc}") from None


def takes_targets(model: nn.Module, loss_target: str) -> None:
    """loss=model calls ``model(inputs, targets)``: say so at once if its forward takes one argument."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise TypeError(f"loss._target_={loss_target}: {type(model).__name__}.forward takes no targets; expected "
                        f"forward(inputs, targets) returning a scalar loss, (logits, loss) or an object with .loss")
