"""What a model returned: its predictions (logits) and its own loss, in the conventions in use.

A tensor; a tuple ``(logits, loss)`` (nanoGPT) or ``(logits,)``; an object with ``.logits`` / ``.loss``
(Hugging Face's ``ModelOutput``); a dict with ``"logits"`` / ``"loss"``. Anything else fails with a line
saying what was expected.
"""

from collections.abc import Mapping
from typing import Any

import torch


class ModelOutputError(TypeError):
    """The model's output lacks what the configured loss or a metric needs."""


def _describe(output: Any) -> str:
    if isinstance(output, torch.Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)}"
    if isinstance(output, Mapping):
        return f"a {type(output).__name__} with keys {sorted(map(str, output))}"
    return f"a {type(output).__name__}"


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


def loss_of(output: Any) -> torch.Tensor:
    """The model's own loss: a scalar tensor, ``(logits, loss)``, ``.loss`` or ``["loss"]``."""
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    if isinstance(output, (tuple, list)) and len(output) == 2 and isinstance(output[1], torch.Tensor) \
            and output[1].dim() == 0:
        return output[1]
    loss = _field(output, "loss")
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    raise ModelOutputError(
        f"the model returned {_describe(output)} with no loss; expected a scalar tensor, (logits, loss), "
        f".loss or ['loss'] (the model computes its loss from the targets or the batch's labels), "
        f"or a loss that takes the outputs (loss=cross_entropy, loss=mse, loss._target_=...)"
    )


def logits_of(output: Any, needed_by: str = "") -> torch.Tensor:
    """The model's predictions: a tensor, the first of a tuple, ``.logits`` or ``["logits"]``."""
    if isinstance(output, torch.Tensor) and output.dim() > 0:
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor) and output[0].dim() > 0:
        return output[0]
    logits = _field(output, "logits")
    if isinstance(logits, torch.Tensor):
        return logits
    prefix = f"{needed_by}: " if needed_by else ""
    raise ModelOutputError(f"{prefix}the model returned {_describe(output)}; expected predictions: a tensor, "
                           f"(logits, loss), .logits or ['logits']")
