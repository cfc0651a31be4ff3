"""A search's time left, from its trials' measured speed: the steps still to train divided by the steps per
second the search has trained at so far (all its trials together, their start-up and pauses included).

The steps still to train: PBT and no scheduler: each trial to ``max_steps`` (a pruner stops some earlier:
the ETA is then an upper bound). ASHA and Hyperband (its brackets taken as the first): rung by rung, the
trials expected to reach it minus those that did, times the stretch below it, less what the trials running
to it have trained already. Every trial reaches the first rung; of the trials at a rung, the share that went
on to the next as measured so far (async ASHA promotes more than ``1/eta``: 11 of 27, then 9 of 11, on the
README's example), ``1/eta`` until ``eta`` trials got there or where fewer went on.

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


def steps_left(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any]) -> float:
    """The search's steps still to train: its trials in flight from where they are, the trials to come whole."""
    known = list(trials)
    n = max(int(n_trials or 0), len(known))
    max_steps = int(search.get("max_steps") or 0)
    if max_steps <= 0:
        return 0.0
    if search.get("scheduler") not in PROMOTING:
        return sum(max(0, max_steps - t.step) for t in known if not t.final) + (n - len(known)) * max_steps
    eta, first = int(search.get("eta") or 3), int(search.get("min_steps") or 0)
    ladder: List[int] = rungs(first, eta, max_steps) if 0 < first < max_steps and eta >= 2 else [max_steps]
    left, expected, below = 0.0, float(n), 0
    for k, rung in enumerate(ladder):
        reached = sum(t.step >= rung for t in known)
        heading = [t.step - below for t in known if not t.final and not t.paused and below <= t.step < rung]
        if k > 0:  # the share of the last rung's trials that went on: as measured once a few reached it
            at_last = sum(t.step >= below for t in known)
            share = (reached + len(heading)) / at_last if at_last >= eta else 0.0
            expected *= max(share, 1.0 / eta)
        expected = max(expected, float(reached + len(heading)))  # those heading there get there
        left += (expected - reached) * (rung - below) - sum(heading)
        below = rung
    return max(0.0, left)


def eta_s(trials: Iterable[Trial], n_trials: Optional[int], search: Mapping[str, Any],
          elapsed_s: float) -> Optional[float]:
    """Seconds left: the steps still to train at the speed measured so far (steps trained / ``elapsed_s``,
    the time since the search's first trial started); None before any step was trained."""
    known = list(trials)
    done = sum(t.step for t in known)
    if done <= 0 or elapsed_s <= 0:
        return None
    return steps_left(known, n_trials, search) / (done / elapsed_s)
