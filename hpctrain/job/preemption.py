"""Take submitit's preemption/timeout signal at a step boundary.

submitit handles USR2 (sent before the time limit, or on preemption) by calling the job's
``checkpoint()`` and requeueing at once, from inside the signal handler, which can land in the middle
of an optimizer step. The guard below only records the signal; the trainer, which holds it among its hooks
(hpctrain.train.hooks), checks it at step boundaries (all ranks agree on the step), saves a consistent
checkpoint on rank 0, and then hands the signal to submitit's own handler, which requeues and exits.
"""

import os
import signal
import sys
import types
from typing import Any, Callable, Optional


class PreemptionGuard:
    def __init__(self) -> None:
        self.requested = False
        self._signum: Optional[int] = None
        self._previous: Optional[Callable[..., Any]] = None

    def install(self) -> "PreemptionGuard":
        if not os.environ.get("SUBMITIT_EXECUTOR"):
            return self  # not a submitit job: nobody will requeue us
        from hpctrain._compat.submitit import preemption_signal

        self._signum = preemption_signal()
        previous = signal.getsignal(self._signum)
        if callable(previous):
            self._previous = previous
            signal.signal(self._signum, self._record)
        return self

    def _record(self, signum: int, frame: Optional[types.FrameType]) -> None:
        self.requested = True

    def hand_over(self) -> None:
        """Let submitit requeue (rank 0) and exit; never returns."""
        assert self._previous is not None and self._signum is not None
        requeue_with(self._previous, self._signum)  # rank 0: checkpoint(), scontrol requeue, sys.exit
        sys.exit(0)  # other ranks: submitit's handler returns; their work is done

    def uninstall(self) -> None:
        """Restore submitit's handler (a signal after the last step is moot: the run is done)."""
        if self._previous is not None and self._signum is not None:
            signal.signal(self._signum, self._previous)

    # ------------------------------------------------------------------ the trainer's hook protocol
    def on_start(self, step: int) -> None:
        self.install()

    def should_stop(self, step: int) -> bool:
        return self.requested

    def on_stop(self, step: int) -> None:
        self.hand_over()

    def on_eval(self, step: int, metrics: Any) -> None:
        return None

    def on_end(self, step: int, status: Any) -> None:
        self.uninstall()


def requeue_with(handler: Callable[..., Any], signum: int) -> None:
    """Call submitit's handler (``checkpoint()``, ``scontrol requeue``, exit) with SIGTERM ignored.

    The requeue makes Slurm SIGTERM every process of the job, scontrol too; an ignored signal stays
    ignored through exec, so scontrol finishes its call (docs/decisions.md, 2026-12-01)."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        handler(signum, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
