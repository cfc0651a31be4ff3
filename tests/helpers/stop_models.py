"""Models for the preemption tests: a run slow to checkpoint once the test says so."""

import os
import time

from user_models import SlowDropout


class SlowToCheckpoint(SlowDropout):
    """Like SlowDropout; on the first attempt, once ``marker`` exists, its ``state_dict`` (hence the
    checkpoint) takes ``save_s``: the run cannot checkpoint within the time a preemption leaves."""

    def __init__(self, in_features: int, num_classes: int, marker: str, save_s: float = 600.0,
                 delay_s: float = 0.01, first_attempt_only: bool = True) -> None:
        super().__init__(in_features, num_classes, delay_s, first_attempt_only)
        self.marker, self.save_s = marker, save_s

    def state_dict(self, *args, **kwargs):
        first = int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0
        if first and os.path.exists(self.marker):
            time.sleep(self.save_s)
        return super().state_dict(*args, **kwargs)
