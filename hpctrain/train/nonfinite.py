"""A loss that went to NaN or Inf ends the run: training on would only burn the allocation.

Checked where the loss is already on the host (the trainer's log steps), so no step pays an extra sync.
``max_nonfinite`` extra log steps in a row may be non-finite before the run fails (0: the first one fails).
"""

import math
from typing import Optional, Tuple


class NonFiniteLossError(ValueError):
    """The training loss is NaN or Inf: the same config diverges again, so the run is not retried."""


class NonFiniteGuard:
    def __init__(self, max_nonfinite: int = 0) -> None:
        self.patience = max(0, int(max_nonfinite))
        self.in_a_row = 0
        self.last_finite: Optional[Tuple[int, float]] = None  # (step, loss)

    def check(self, step: int, loss: float, lr: float) -> None:
        """Raise :class:`NonFiniteLossError` once more than ``max_nonfinite`` log steps in a row were non-finite."""
        if math.isfinite(loss):
            self.in_a_row, self.last_finite = 0, (step, loss)
            return
        self.in_a_row += 1
        if self.in_a_row <= self.patience:
            return
        before = (f"last finite loss {self.last_finite[1]:.4g} at step {self.last_finite[0]}"
                  if self.last_finite is not None else "no finite loss logged before")
        raise NonFiniteLossError(f"loss is {loss} at step {step}; lr={lr:.3g}, {before} "
                                 f"(max_nonfinite={self.patience})")
