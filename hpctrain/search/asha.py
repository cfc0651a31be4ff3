"""Promotion ASHA and Hyperband as :class:`hpctrain.search.units.Scheduler` s (Li et al., MLSys 2020).

Rungs at ``min_steps * eta^k`` below ``max_steps``, then ``max_steps`` itself. A trial reaching a rung below
the last pauses there (its checkpoint kept, its objective reported at the rung's step). A free worker, from
the highest rung down, promotes a paused trial that is in the top ``floor(n / eta)`` of the ``n`` trials that
reached its rung and has not left it yet (to the next rung); else starts a new trial at the first rung while
fewer than ``n_trials`` exist; else waits while any unit runs (its result may make a promotion possible);
else the study is done, and every trial still paused ends ``pruned`` at its rung (its objective: the
value there), as Optuna's pruned trials do.

Hyperband runs several ASHA brackets side by side: bracket ``j`` starts at ``min_steps * eta^j`` (the last
bracket is whole runs). Trial ``n`` goes to a bracket by a fixed cycle in Hyperband's proportions (bracket
``j`` gets ``ceil((K) / (K - j) * eta^(K - 1 - j))`` of each cycle, ``K`` brackets); promotions stay
within a bracket. Pure: no optuna, no torch.
"""

import math
from typing import Dict, List, Optional, Tuple

from hpctrain.core.state import State
from hpctrain.search.units import Next, StudyView, TrialView, Unit, UnitKind


def rungs(min_steps: int, eta: int, max_steps: int) -> List[int]:
    """``[min_steps, min_steps*eta, ...]`` below ``max_steps``, then ``max_steps``."""
    out, r = [], int(min_steps)
    while r < max_steps:
        out.append(r)
        r *= eta
    return out + [int(max_steps)]


def _key(value: Optional[float], sign: float) -> Tuple[bool, float]:
    bad = value is None or math.isnan(value)
    return bad, 0.0 if bad else sign * float(value)  # type: ignore[arg-type]


class Asha:
    def __init__(self, min_steps: int, eta: int, max_steps: int, brackets: int = 1) -> None:
        self.eta, self.max_steps = int(eta), int(max_steps)
        self.ladders = [rungs(int(min_steps) * self.eta ** j, self.eta, self.max_steps) for j in range(brackets)]
        self.cycle = [0] if brackets == 1 else _cycle(brackets, self.eta)

    def bracket_of(self, number: int) -> int:
        return self.cycle[number % len(self.cycle)]

    def _bracket(self, t: TrialView) -> int:
        return t.unit.bracket if t.unit is not None else self.bracket_of(t.number)

    # ------------------------------------------------------------ the rung table
    def rung_members(self, view: StudyView, bracket: int, k: int) -> List[TrialView]:
        """The trials that reached rung ``k`` of ``bracket`` (they reported the objective at its step)."""
        step = self.ladders[bracket][k]
        return [t for t in view.trials if self._bracket(t) == bracket and step in t.values]

    def promotable(self, view: StudyView) -> List[Tuple[int, int, TrialView]]:
        """(bracket, rung, trial) of every paused trial in the top 1/eta of its rung, best first within a rung,
        highest rung first."""
        sign = view.direction.sign
        out: List[Tuple[int, int, TrialView]] = []
        for b, ladder in enumerate(self.ladders):
            for k in reversed(range(len(ladder) - 1)):
                members = self.rung_members(view, b, k)
                top = sorted(members, key=lambda t: _key(t.values[ladder[k]], sign))[: len(members) // self.eta]
                out += [(b, k, t) for t in top
                        if t.state is State.PAUSED and t.unit is not None and t.unit.index == k
                        and not _key(t.values[ladder[k]], sign)[0]]
        out.sort(key=lambda p: -p[1])  # stable: highest rung first, then bracket, then best
        return out

    # ------------------------------------------------------------ Scheduler
    def next_unit(self, view: StudyView) -> "Unit | Next":
        found = self.promotable(view)
        if found:
            b, k, t = found[0]
            ladder = self.ladders[b]
            return Unit(t.number, UnitKind.PROMOTE, ladder[k], ladder[k + 1], dict(t.params), None, k + 1, b)
        if view.next_number < view.n_trials:
            b = self.bracket_of(view.next_number)
            return Unit(None, UnitKind.NEW, 0, self.ladders[b][0], {}, None, 0, b)
        if any(t.state is State.RUNNING for t in view.trials):
            return Next.IDLE
        return Next.DONE

    def stranded(self, view: StudyView) -> List[int]:
        if self.promotable(view) or view.next_number < view.n_trials \
                or any(t.state is State.RUNNING for t in view.trials):
            return []
        return [t.number for t in view.trials if t.state is State.PAUSED]

    def table(self, view: StudyView) -> List[Dict[str, Optional[float]]]:
        """Per bracket and rung: its step, the trials that reached it, how many left it, the best value."""
        rows = []
        sign = view.direction.sign
        for b, ladder in enumerate(self.ladders):
            for k, step in enumerate(ladder):
                members = self.rung_members(view, b, k)
                left = [t for t in members if t.unit is not None and t.unit.index > k]
                best = min(members, key=lambda t: _key(t.values[step], sign), default=None)
                rows.append({"bracket": b, "rung": k, "step": step, "trials": len(members), "promoted": len(left),
                             "best": None if best is None else best.values[step],
                             "best_trial": None if best is None else best.number})
        return rows


def _cycle(brackets: int, eta: int) -> List[int]:
    """One cycle of bracket assignments in Hyperband's proportions, interleaved (a bracket's trials spread)."""
    counts = [math.ceil(brackets / (brackets - j) * eta ** (brackets - 1 - j)) for j in range(brackets)]
    slots = sorted(((i + 0.5) / n, j) for j, n in enumerate(counts) for i in range(n))
    return [j for _, j in slots]


def hyperband(min_steps: int, eta: int, max_steps: int) -> Asha:
    """ASHA brackets from every rung below max_steps, and one of whole runs."""
    return Asha(min_steps, eta, max_steps, brackets=len(rungs(min_steps, eta, max_steps)))
