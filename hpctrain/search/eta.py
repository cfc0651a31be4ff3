"""A search's time left, from its trials' measured speed: the steps still to train divided by the steps per
second the search has trained at so far (all its trials together, their start-up and pauses included).

The steps still to train: each trial not started, and each trial in flight from its step on, is expected to
train what its scheduler gives a trial on average. ASHA and Hyperband: the stretch to the rung it runs to,
then each later rung's stretch times the share of trials promoted that far (``1/eta`` a rung; a paused
trial's next stretch too; Hyperband's brackets are taken as its first); PBT and no scheduler: up to
``max_steps`` (a pruner stops some earlier: the ETA is then an upper bound). A final trial trains nothing more.

Pure: the caller reads the trials (the launcher's progress display). No torch, no Optuna.
"""

from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Optional

from hpctrain.search.asha import rungs

PROMOTING = ("asha", "hyperband")


@dataclass(frozen=True)
class Trial:
    step: int  # steps trained so far (0: not started)
    final: bool  # completed, pruned or failed: nothing more to train
    paused: bool = False  # at a rung (or PBT interval) it reached: its next stretch only if it is promoted


def expected_left(step: int, search: Mapping[str, Any], paused: bool = False) -> float:
    """Steps a trial at ``step`` is expected still to train, as its scheduler runs trials on average; ``paused``:
    it waits at the rung it reached (a running one trains to its next rung for sure)."""
    max_steps = int(search.get("max_steps") or 0)
    if max_steps <= 0:
        return 0.0
    if search.get("scheduler") not in PROMOTING:
        return float(max(0, max_steps - step))
    eta, first = int(search.get("eta") or 3), int(search.get("min_steps") or 0)
    ladder: List[int] = rungs(first, eta, max_steps) if 0 < first < max_steps and eta >= 2 else [max_steps]
    left, chance, below = 0.0, (1.0 / eta if paused else 1.0), 0
    for rung in ladder:
        if rung > step:
            left += chance * (rung - max(step, below))
            chance /= eta  # the share of the trials at this rung that are promoted to the next
        below = rung
    return left


def steps_left(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any]) -> float:
    """The search's steps still to train: its trials in flight from where they are, the trials to come whole."""
    known = list(trials)
    left = sum(expected_left(t.step, search, t.paused) for t in known if not t.final)
    to_come = max(0, int(n_trials or 0) - len(known))
    return left + to_come * expected_left(0, search)


def eta_s(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any],
          elapsed_s: float) -> Optional[float]:
    """Seconds left: the steps still to train at the speed measured so far (steps trained / ``elapsed_s``,
    the time since the search's first trial started); None before any step was trained."""
    known = list(trials)
    done = sum(t.step for t in known)
    if done <= 0 or elapsed_s <= 0:
        return None
    return steps_left(known, n_trials, search) / (done / elapsed_s)
