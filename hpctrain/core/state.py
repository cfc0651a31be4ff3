"""A run's state as users see it, the kinds of event in its record, an objective's direction, and the fold.

The one vocabulary: every other module compares against these enums; strings appear only where JSON is
read or written (``State(value)``, ``Direction.parse(text)``). ``State`` and ``Direction`` are
``str``-valued, so ``json.dumps`` writes them as before (``"completed"``, ``"min"``).

The fold, in words: only the events since the last ``submitted`` count (a rerun starts afresh);
``retrying`` and ``requeued`` end an attempt; within the current attempt the strongest event wins:
completed > pruned > cancelled > timeout > failed > running. A failed attempt's error is a rank's own
error over the collective fallout the other ranks saw (lowest rank first), whatever order they wrote in.
Pure: it opens only the files of a failed attempt (for the error). No torch, no Hydra.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

from hpctrain.core.atomic import read_json


class State(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    REQUEUED = "requeued"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    PRUNED = "pruned"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Any) -> Optional["State"]:
        """A state read from JSON (metrics.json's ``status``); None for anything else."""
        try:
            return cls(value)
        except ValueError:
            return None


ACTIVE = frozenset({State.QUEUED, State.RUNNING, State.REQUEUED, State.RETRYING})
FINAL = frozenset({State.COMPLETED, State.FAILED, State.TIMEOUT, State.CANCELLED, State.PRUNED})
FAILURES = (State.FAILED, State.TIMEOUT)  # the states whose error is shown


class EventKind(str, Enum):
    """The kinds of event file in a run's record (the second part of the file name)."""

    SUBMITTED = "submitted"
    STARTED = "started"
    FAILED = "failed"
    RETRYING = "retrying"
    REQUEUED = "requeued"
    COMPLETED = "completed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    PRUNED = "pruned"

    def __str__(self) -> str:
        return self.value


class Direction(str, Enum):
    """Whether lower or higher is better: ``min`` / ``max`` (report, the objective), Optuna's ``minimize`` /
    ``maximize`` (the study, sweep.json's ``search``)."""

    MIN = "min"
    MAX = "max"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Any) -> "Direction":
        """Every spelling in use: ``min``/``max``, ``minimize``/``maximize``, Optuna's ``StudyDirection``
        (the enum or its name, ``StudyDirection.MAXIMIZE``). Raises ValueError on anything else."""
        if isinstance(value, Direction):
            return value
        text = str(getattr(value, "name", value)).rsplit(".", 1)[-1].strip().lower()
        found = _SPELLINGS.get(text)
        if found is None:
            raise ValueError(f"not a direction: {value!r} (expected min, max, minimize or maximize)")
        return found

    @property
    def optuna(self) -> str:
        """Optuna's name for it (``create_study(direction=...)``)."""
        return "maximize" if self is Direction.MAX else "minimize"

    @property
    def sign(self) -> float:
        """Sorting key factor: ``sorted(values, key=lambda v: direction.sign * v)`` puts the best first."""
        return 1.0 if self is Direction.MIN else -1.0

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is strictly better than ``b``."""
        return a < b if self is Direction.MIN else a > b


_SPELLINGS = {"min": Direction.MIN, "minimize": Direction.MIN, "max": Direction.MAX, "maximize": Direction.MAX}


# ---------------------------------------------------------------- events and the fold
@dataclass(frozen=True)
class Event:
    time_ns: int
    kind: EventKind
    rank: int  # -1: not a rank (launcher, batch script, login node)
    path: str  # the file, read only when its details are needed

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))  # a kind given as its file-name text

    def data(self) -> Dict[str, Any]:
        """The event's details; ``{}`` when the file is unreadable or not JSON (it still counts)."""
        return read_json(self.path) or {}


_BOUNDARY = {EventKind.RETRYING: State.RETRYING, EventKind.REQUEUED: State.REQUEUED}  # these end an attempt
# within an attempt: the strongest event wins, whatever the order the ranks wrote in
_STRENGTH = [(EventKind.COMPLETED, State.COMPLETED), (EventKind.PRUNED, State.PRUNED),
             (EventKind.CANCELLED, State.CANCELLED), (EventKind.TIMEOUT, State.TIMEOUT),
             (EventKind.FAILED, State.FAILED), (EventKind.STARTED, State.RUNNING)]


@dataclass
class RunState:
    state: Optional[State]  # None: the run has no record (not launched by hpctrain, or an older run)
    starts: int = 0  # attempts started since the last submission
    retries: int = 0  # retrying events since the last submission: the retry budget used
    requeues: int = 0  # preemptions / time limits since the last submission
    submissions: int = 0
    error: Optional[str] = None  # the failed attempt's error: a rank's own over the fallout
    failed_rank: Optional[int] = None
    last_start: Optional[Event] = None
    started_at: Optional[float] = None  # first start of this submission
    ended_at: Optional[float] = None  # the final event's time
    events: List[Event] = field(default_factory=list)

    @property
    def job_id(self) -> Optional[str]:
        """The job id of the last start (read from its file only when asked)."""
        return self.last_start.data().get("job_id") if self.last_start is not None else None

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    @property
    def attempt(self) -> Tuple[int, int, int]:
        """Which attempt the record is at: (submissions, starts, attempt-ending events); grows with each."""
        return self.submissions, self.starts, self.retries + self.requeues

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def final(self) -> bool:
        return self.state in FINAL


def fold(all_events: List[Event]) -> RunState:
    """The run's state from its events (sorted by time). Pure: opens the files of a failed attempt only."""
    if not all_events:
        return RunState(None)
    subs = [i for i, e in enumerate(all_events) if e.kind is EventKind.SUBMITTED]
    current = all_events[subs[-1]:] if subs else all_events
    bounds = [i for i, e in enumerate(current) if e.kind in _BOUNDARY]
    attempt = current[bounds[-1] + 1:] if bounds else current
    kinds = {e.kind for e in attempt}
    out = RunState(None, events=all_events, submissions=len(subs))
    starts = [e for e in current if e.kind is EventKind.STARTED]
    out.starts = len(starts)
    out.retries = sum(e.kind is EventKind.RETRYING for e in current)
    out.requeues = sum(e.kind is EventKind.REQUEUED for e in current)
    if starts:
        out.started_at = starts[0].time_ns / 1e9
        out.last_start = starts[-1]
    for kind, state in _STRENGTH:
        if kind in kinds:
            out.state = state
            break
    else:
        out.state = _BOUNDARY[current[bounds[-1]].kind] if bounds else State.QUEUED
    if out.state in FAILURES:
        out.error, out.failed_rank = _cause([e for e in attempt if e.kind in (EventKind.FAILED, EventKind.TIMEOUT)])
    if out.state in FINAL:
        out.ended_at = max(e.time_ns for e in attempt if e.kind is not EventKind.STARTED) / 1e9
    return out


def _cause(failures: List[Event]) -> Tuple[Optional[str], Optional[int]]:
    """The failing rank's own error wins over the fallout; then the lowest rank (order-independent)."""
    def key(pair: Tuple[Event, Dict[str, Any]]) -> Tuple[bool, int, int]:
        e, d = pair
        rank = e.rank if e.rank >= 0 else 1 << 30  # a rank's own words before the batch script's
        return bool(d.get("fallout")), rank, e.time_ns

    details = sorted(((e, e.data()) for e in failures), key=key)
    if not details:
        return None, None
    e, d = details[0]
    return (str(d["error"]) if d.get("error") else None), (e.rank if e.rank >= 0 else None)
