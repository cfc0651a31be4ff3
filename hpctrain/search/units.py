"""Units of work: what a search worker runs next, and the scheduler that decides it.

The interface (shared by every scheduler: ``none``, promotion ASHA and Hyperband in
:mod:`hpctrain.search.asha`, PBT in :mod:`hpctrain.search.pbt`):

- A :class:`Unit` is one stretch of one trial's training: trial ``trial`` (None for a ``NEW`` unit: the
  number is fixed when the study claims it) from ``start_step`` to ``end_step``, with ``params``
  (empty for ``NEW``: the sampler fills them), ``copy_from`` (a trial whose checkpoint is copied into this
  trial's run dir first: a PBT exploit; None otherwise), ``index`` (the rung, or the PBT interval, it
  ends at) and ``bracket`` (Hyperband's; 0 otherwise). Kinds: ``NEW`` (a fresh trial, from step 0),
  ``PROMOTE`` (ASHA: a paused trial resumed to its next rung), ``CONTINUE`` (PBT: a member's next interval).
- A :class:`Scheduler` answers :meth:`Scheduler.next_unit` from a :class:`StudyView` (what the study holds:
  every trial's state, parameters, objective per reported step and current unit) with a Unit or a
  :class:`Next`. It is pure: the study claims the unit it picked, fenced by the trial's lease generation
  (:mod:`hpctrain.search.leases`), so a stale view can cost a lost claim, never a unit run twice.
  :meth:`Scheduler.stranded` names the paused trials that no unit will ever resume once the scheduler says
  ``DONE``: the study ends them ``pruned`` at the step they paused at (their objective: the value there).
- A finished unit is reported by the worker: the objective at ``end_step`` (``trial.report``), then
  :func:`outcome`: ``paused`` when ``end_step < max_steps`` (state ``paused``, a ``paused`` event, the
  lease marked paused with this unit), else ``completed`` (told to the study with that value).
- The app stops at ``end_step`` (hpctrain's trainer through its hooks' ``end_step()``; any Hydra app through
  :mod:`hpctrain.search.api`), checkpoints exactly there and returns; its LR schedule still runs over the full
  ``max_steps``, so a trial paused and resumed ends with the weights of an uninterrupted run.
- ``scheduler=none`` is one ``NEW`` unit per trial from 0 to ``max_steps`` (the pruner may still stop it).

Pure: no optuna, no torch (the login node imports it for its checks).
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Protocol

from hpctrain.core.state import Direction, State


class UnitKind(str, Enum):
    NEW = "new"
    PROMOTE = "promote"
    CONTINUE = "continue"

    def __str__(self) -> str:
        return self.value


class Next(Enum):
    """No unit for this worker now."""

    DONE = "done"  # the study needs no more work from it
    WAIT = "wait"  # some owner's fate is unknown (or a claim is under way): look again later
    IDLE = "idle"  # units are running whose results may make new work (a promotion): look again soon


@dataclass(frozen=True)
class Unit:
    trial: Optional[int]
    kind: UnitKind
    start_step: int
    end_step: int
    params: Dict[str, Any] = field(default_factory=dict)
    copy_from: Optional[int] = None
    index: int = 0  # the rung (asha, hyperband) or interval (pbt) this unit ends at
    bracket: int = 0

    def fields(self) -> Dict[str, Any]:
        """As stored in a lease's claim file (JSON)."""
        return {"trial": self.trial, "kind": self.kind.value, "start_step": self.start_step,
                "end_step": self.end_step, "params": dict(self.params), "copy_from": self.copy_from,
                "index": self.index, "bracket": self.bracket}

    @classmethod
    def from_fields(cls, d: Dict[str, Any]) -> "Unit":
        return cls(None if d.get("trial") is None else int(d["trial"]), UnitKind(d.get("kind", "new")),
                   int(d.get("start_step", 0)), int(d["end_step"]), dict(d.get("params") or {}),
                   None if d.get("copy_from") is None else int(d["copy_from"]), int(d.get("index", 0)),
                   int(d.get("bracket", 0)))

    def numbered(self, number: int) -> "Unit":
        return Unit(number, self.kind, self.start_step, self.end_step, dict(self.params), self.copy_from,
                    self.index, self.bracket)


@dataclass
class TrialView:
    number: int
    state: State  # running | paused | completed | pruned | failed (a trial asked but not claimed: running)
    params: Dict[str, Any] = field(default_factory=dict)
    values: Dict[int, float] = field(default_factory=dict)  # the objective reported at each step
    unit: Optional[Unit] = None  # the unit it runs, or (paused) the one it paused at the end of

    @property
    def paused_at(self) -> Optional[int]:
        return self.unit.end_step if self.state is State.PAUSED and self.unit is not None else None


@dataclass
class StudyView:
    trials: List[TrialView]
    n_trials: int  # the budget: never more trials than this
    max_steps: int
    direction: Direction = Direction.MIN

    @property
    def next_number(self) -> int:
        return len(self.trials)

    def by_number(self) -> Dict[int, TrialView]:
        return {t.number: t for t in self.trials}


class Scheduler(Protocol):
    def next_unit(self, view: StudyView) -> "Unit | Next":
        """The unit a free worker should run now, or why there is none."""

    def stranded(self, view: StudyView) -> List[int]:
        """Once ``next_unit`` says DONE: the paused trials that nothing will resume (ended as pruned)."""


def outcome(unit: Unit, max_steps: int) -> State:
    """How a trial stands after a unit ran to its end: paused before ``max_steps``, else completed."""
    return State.PAUSED if unit.end_step < max_steps else State.COMPLETED

