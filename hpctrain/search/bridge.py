"""The search trial as a trainer hook: report the objective at each eval, say whether to stop (pruned),
and where the trial's unit of work ends (``end_step``: the trainer pauses there; None: max_steps).

The search worker installs a :class:`TrialBridge` around a trial (:func:`activate`); hpctrain.app finds
it with :func:`current` (``None`` outside a search) and hands it to the Trainer among its hooks
(hpctrain.train.hooks.TrainerHook). Only rank 0 holds the Optuna trial and asks the pruner; the trainer
broadcasts its answer so every rank stops at the same step. No torch, no optuna import here.
"""

import os
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
        try:
            self.report(value, step)
            prune = bool(self._storage("asking the pruner", lambda t: t.should_prune()))
        except (OSError, ValueError, RuntimeError) as exc:  # the storage's, after its retries
            # safe to go on: an eval's report only feeds the pruner; the worker tells the final objective
            print(f"hpctrain search: trial {self.number}: step {step}: the study could not be reached "
                  f"({type(exc).__name__}: {exc}); this eval is not reported, the run goes on", flush=True)
            return False
        if prune:
            self.pruned_at = step
        return prune

    def report(self, value: float, step: int) -> None:
        """Rank 0: the objective at ``step`` into the study (once per step: Optuna keeps the first)."""
        if self.trial is None or step in self.reported:
            return
        self._storage("reporting", lambda t: t.report(float(value), step))
        self.reported[step] = float(value)

    def _storage(self, what: str, call: Any) -> Any:
        """``call(trial)``, retried on a fresh study after a storage error (the sweep dir: the run dir's parent)."""
        from hpctrain.search.study import retrying_trial  # rank 0 only, where optuna is loaded already

        sweep = os.path.dirname(os.path.abspath(self.run_dir)) if self.run_dir else None
        self.trial, got = retrying_trial(self.trial, sweep, what, call)
        return got

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
