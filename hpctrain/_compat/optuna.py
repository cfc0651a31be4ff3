"""Optuna's private names: a trial's storage id and the study's storage.

When a release moves one of these, this module is the one to change (canaries: tests/test_compat_heavy.py).
Optuna is imported inside the functions: the login node loads it only for a search.
"""

from typing import Any


def trial_id(trial: Any) -> int:
    """The storage's id of a trial (Trial or FrozenTrial); ``trial.number`` is the study's, not the storage's."""
    return trial._trial_id


def live_trial(study: Any, trial_id: int) -> Any:
    """An ``optuna.Trial`` over an existing (running) trial of the study, to report to and ask the pruner."""
    import optuna

    return optuna.Trial(study, trial_id)


def set_trial_system_attr(study: Any, trial_id: int, key: str, value: Any) -> None:
    """A system attribute on a trial, also one already finished (Trial.set_system_attr is deprecated)."""
    study._storage.set_trial_system_attr(trial_id, key, value)


class PausedAsPruned:
    """The study as a sampler sees it in a study whose trials pause between units (promotion ASHA, Hyperband):
    a RUNNING trial that reported values shows as PRUNED at its last reported step, as Optuna's own samplers
    take a trial a pruner stopped (TPE ranks such trials by the step they reached, then their value there).
    Paused trials stay RUNNING in the storage until the study ends, so without this TPE counted none of them
    toward its startup trials (it sampled at random all study long) and, lying constantly, took each as a bad
    point. Wraps ``Study._get_trials``, the one call Optuna's samplers read the trials through."""

    def __init__(self, study: Any) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list:
        import copy

        from optuna.trial import TrialState

        out = []
        for t in self._study._get_trials(deepcopy=False, states=None, use_cache=False):
            if t.state == TrialState.RUNNING and t.intermediate_values:
                t = copy.copy(t)
                t.state = TrialState.PRUNED
            elif deepcopy:
                t = copy.deepcopy(t)
            if states is None or t.state in states:
                out.append(t)
        return out

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list:
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list:
        return self._get_trials()


def lock_file(lock: Any) -> str:
    """The file whose exclusive creation is a ``JournalFileOpenLock`` (``<path>.lock``)."""
    return lock._lock_file
