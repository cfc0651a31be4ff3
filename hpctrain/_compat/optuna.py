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
