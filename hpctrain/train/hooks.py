"""What the trainer asks the code around it: stop at an eval (pruning), stop now (preemption), start, end,
and (optional) the step where a search unit ends: the run stops there, checkpointed, as ``paused``.

The trainer knows hooks by this protocol only; the search trial's hook lives in hpctrain.search.bridge,
the preemption guard in hpctrain.job.preemption, and hpctrain.app hands them to the Trainer.
"""

from typing import Mapping, Optional, Protocol

from hpctrain.core.state import State


class TrainerHook(Protocol):
    def on_start(self, step: int) -> None:
        """Training begins (or resumes) at ``step``."""

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> Optional[str]:
        """After an eval: why to end the run here as pruned, or None to go on (rank 0's answer counts)."""

    def should_stop(self, step: int) -> bool:
        """Asked every step, so cheap and local: True to checkpoint now and give the job back (preemption)."""

    def on_stop(self, step: int) -> None:
        """After that checkpoint: hand the job over (a requeue); may not return."""

    def on_end(self, step: int, status: State) -> None:
        """The run ends as ``status`` (completed, pruned or paused); called after its final eval and checkpoint."""

    # optional (looked up with getattr, so hooks without it need not define it):
    # def end_step(self) -> Optional[int]:
    #     """Where this run must stop (a search unit's end, before max_steps): it ends ``paused`` there."""
