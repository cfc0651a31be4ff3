"""The search trial as a trainer hook: report the objective at each eval, say whether to stop (pruned),
and where the trial's unit of work ends (``end_step``: the trainer pauses there; None: max_steps).

The search worker installs a :class:`TrialBridge` around a trial (:func:`activate`); hpctrain.app finds
it with :func:`current` (``None`` outside a search) and hands it to the Trainer among its hooks
(hpctrain.train.hooks.TrainerHook). Only rank 0 holds the Optuna trial and asks the pruner; the trainer
broadcasts its answer so every rank stops at the same step. No torch, no optuna import here.
"""

from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional

_current: Optional["TrialBridge"] = None


class TrialBridge:
    def __init__(self, number: int, metric: Optional[str], trial: Any = None, end: Optional[int] = None,
                 max_steps: Optional[int] = None, run_dir: Optional[str] = None) -> None:
        self.number = number
        self.end = end  # the unit's end step (a scheduler's); None: the run goes to max_steps
        self.max_steps = max_steps
        self.run_dir = run_dir
        self.reported: dict = {}  # step -> value reported by this process
        self.metric = metric  # the objective's metric name (``val/loss``); None: the return value only
        self.trial = trial  # optuna.Trial on rank 0, None on the other ranks
        self.pruned_at: Optional[int] = None

    def should_prune(self, value: Optional[float], step: int) -> bool:
        """Rank 0: report ``value`` at ``step`` and ask the study's pruner. Other ranks: False (they take
        rank 0's answer from the trainer's broadcast)."""
        if self.trial is None or value is None:
            return False  # NaN is reported: Optuna's median/percentile pruners stop a trial that diverged
        self.report(value, step)
        prune = bool(self.trial.should_prune())
        if prune:
            self.pruned_at = step
        return prune

    def report(self, value: float, step: int) -> None:
        """Rank 0: the objective at ``step`` into the study (once per step: Optuna keeps the first)."""
        if self.trial is None or step in self.reported:
            return
        self.trial.report(float(value), step)
        self.reported[step] = float(value)

    # ------------------------------------------------------------------ TrainerHook
    def end_step(self) -> Optional[int]:
        return self.end

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> Optional[str]:
        return "the search's pruner" if self.should_prune(metrics.get(self.metric or ""), step) else None

    def on_start(self, step: int) -> None:
        pass

    def should_stop(self, step: int) -> bool:
        return False  # preemption is the job's (PreemptionGuard), not the trial's

    def on_stop(self, step: int) -> None:
        pass

    def on_end(self, step: int, status: Any) -> None:
        pass


def current() -> Optional[TrialBridge]:
    return _current


@contextmanager
def activate(bridge: TrialBridge) -> Iterator[TrialBridge]:
    global _current
    previous, _current = _current, bridge
    try:
        yield bridge
    finally:
        _current = previous
