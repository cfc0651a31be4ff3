"""A run's state as users see it, the kinds of event in its record, an objective's direction, and the fold.

The one vocabulary: every other module compares against these enums; strings appear only where JSON is
read or written (``State(value)``, ``Direction.parse(text)``). ``State`` and ``Direction`` are
``str``-valued, so ``json.dumps`` writes them as before (``"completed"``, ``"min"``).

The fold, in words. Writers' clocks need not agree (a login node behind the compute nodes, two nodes of
one job): order comes from the tags each writer puts in the file name, not from its time. Each event
belongs to a submission (the number of ``submitted`` events its writer saw; a rerun starts afresh) and
to an attempt: each ``started`` opens the next attempt (one more than the highest its writer saw), and
the other events of that attempt carry its number, or its Slurm job and restart count, which the fold
maps to the attempt whose ``started`` has the same. Untagged events (records written before the tags)
are placed by time, as they always were: ``retrying`` and ``requeued`` end an attempt.

Within the current submission, ``completed`` > ``pruned`` > ``cancelled`` are final: once in the record
no later event, in any attempt, undoes them. Otherwise the latest attempt decides, by precedence, never
by the order its events were written in: timeout > retrying > requeued > hung > failed > paused > running.
``paused`` (a search trial at a unit's end) is neither active nor final: a promotion starts a new attempt. A new start
after a failure (a retry, a rerun of ``python -m hpctrain``) begins a new attempt. Budgets count attempts,
not events: a retry recorded twice for one attempt counts once. A failed attempt's error is a rank's own
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
    HELD = "held"  # Slurm holds the job (a failed launch after a node failure, an administrator's hold)
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    PRUNED = "pruned"
    PAUSED = "paused"  # a search trial stopped at a unit's end, its checkpoint kept for a promotion
    HUNG = "hung"  # no rank advanced for its hang allowance: the watchdog ended the attempt (hpctrain.job.watchdog)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Any) -> Optional["State"]:
        """A state read from JSON (metrics.json's ``status``); None for anything else."""
        try:
            return cls(value)
        except ValueError:
            return None


ACTIVE = frozenset({State.QUEUED, State.RUNNING, State.REQUEUED, State.HELD, State.RETRYING})
FINAL = frozenset({State.COMPLETED, State.FAILED, State.TIMEOUT, State.CANCELLED, State.PRUNED, State.HUNG})
RESTING = frozenset({State.PAUSED})  # neither: no job holds it, and a promotion may yet resume it
FAILURES = (State.FAILED, State.TIMEOUT, State.HUNG)  # the states whose error is shown


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
    PAUSED = "paused"
    HUNG = "hung"
    STRAGGLER = "straggler"  # a rank persistently slower than the others (hpctrain.job.straggler): no state change

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
    time_ns: int  # the writer's own clock: for display and for untagged (older) records only
    kind: EventKind
    rank: int  # -1: not a rank (launcher, batch script, login node)
    path: str  # the file, read only when its details are needed
    submission: Optional[int] = None  # tags from the file name; None in records written before them
    attempt: Optional[int] = None
    key: Optional[str] = None  # the Slurm job and restart count it was written in (``123_4r1``)

    def __post_init__(self) -> None:
        if type(self.kind) is not EventKind:  # a kind given as its file-name text
            object.__setattr__(self, "kind", EventKind(self.kind))

    def data(self) -> Dict[str, Any]:
        """The event's details; ``{}`` when the file is unreadable or not JSON (it still counts)."""
        return read_json(self.path) or {}


# the error a failed requeue is recorded with (hpctrain.job.preemption.RequeueFailed, job.attempt_ended): that
# attempt's ``requeued`` never happened, so it neither ranks above the failure nor counts as a requeue
REQUEUE_FAILED = "the requeue failed"
_BOUNDARY = frozenset({EventKind.RETRYING, EventKind.REQUEUED})  # untagged records: these end an attempt
# final for the whole submission, strongest first: nothing after them undoes them
_FINAL_EVENTS = [(EventKind.COMPLETED, State.COMPLETED), (EventKind.PRUNED, State.PRUNED),
                 (EventKind.CANCELLED, State.CANCELLED)]
# within the latest attempt: the strongest event wins, whatever the order (or the clocks) they were written in
_PRECEDENCE = [(EventKind.TIMEOUT, State.TIMEOUT), (EventKind.RETRYING, State.RETRYING),
               (EventKind.REQUEUED, State.REQUEUED), (EventKind.HUNG, State.HUNG), (EventKind.FAILED, State.FAILED),
               (EventKind.PAUSED, State.PAUSED), (EventKind.STARTED, State.RUNNING)]


# the events whose error a failed state shows: a hang's own line, not the fallout its killed ranks wrote
_ERRORS = {State.FAILED: (EventKind.FAILED, EventKind.TIMEOUT), State.TIMEOUT: (EventKind.FAILED, EventKind.TIMEOUT),
           State.HUNG: (EventKind.HUNG,)}


@dataclass
class RunState:
    state: Optional[State]  # None: the run has no record (not launched by hpctrain, or an older run)
    starts: int = 0  # started events since the last submission
    retries: int = 0  # attempts retried since the last submission: the retry budget used
    requeues: int = 0  # attempts requeued (preemption / time limit) since the last submission
    submissions: int = 0
    error: Optional[str] = None  # the failed attempt's error: a rank's own over the fallout
    failed_rank: Optional[int] = None
    last_start: Optional[Event] = None
    started_at: Optional[float] = None  # first start of this submission
    ended_at: Optional[float] = None  # the final event's time
    events: List[Event] = field(default_factory=list)
    attempts: int = 0  # the highest attempt started since the last submission (a Slurm requeue counts)
    units: int = 0  # attempts that ended paused with a later start: a search's scheduled next unit, not a restart

    @property
    def job_id(self) -> Optional[str]:
        """The job id of the last start (read from its file only when asked)."""
        return self.last_start.data().get("job_id") if self.last_start is not None else None

    @property
    def restarts(self) -> int:
        """Starts again of the same work (a retry, a requeue, an adoption), not a search's next unit (a
        promotion, a PBT interval: the start after a ``paused`` attempt, its ``started`` says ``how``)."""
        return max(0, self.attempts - 1 - self.units)

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


def placed(all_events: List[Event]) -> List[Tuple[int, int, Event]]:
    """Each event with its (submission, attempt): from its tags, else (an untagged event) from time order."""
    ordered = sorted(all_events, key=lambda e: (e.time_ns, e.path))
    by_key: Dict[Tuple[Optional[int], str], int] = {}
    key_starts: Dict[Tuple[Optional[int], str], set] = {}  # one Slurm attempt may start several search units
    for e in ordered:
        if e.kind is EventKind.STARTED and e.key and e.attempt is not None:
            by_key.setdefault((e.submission, e.key), e.attempt)
            key_starts.setdefault((e.submission, e.key), set()).add(e.attempt)
    out = []
    sub, n_subs = 0, 0
    current: Dict[int, int] = {}  # per submission: the attempt in progress, for untagged events
    ended: Dict[int, bool] = {}
    for e in ordered:
        if e.kind is EventKind.SUBMITTED:
            n_subs += 1
            sub = e.submission if e.submission is not None else n_subs
        esub = e.submission if e.submission is not None else sub
        if e.kind is EventKind.SUBMITTED:
            att = 0
        elif e.key and (esub, e.key) in by_key:
            # an attempt its own key started keeps its tag (a worker's next unit of the trial); else the key's first
            own = e.attempt is not None and e.attempt in key_starts[(esub, e.key)]
            att = e.attempt if own and e.attempt is not None else by_key[(esub, e.key)]
        elif e.attempt is not None:
            att = e.attempt
        else:  # untagged: the attempt in progress; after a boundary, or at a first start, the next one
            att = current.get(esub, 0)
            if ended.get(esub) or (e.kind is EventKind.STARTED and att == 0):
                att, ended[esub] = att + 1, False
            if e.kind in _BOUNDARY:
                ended[esub] = True
        current[esub] = max(current.get(esub, 0), att)
        out.append((esub, att, e))
    return out


def fold(all_events: List[Event]) -> RunState:
    """The run's state from its events (any order). Pure: opens the files of a failed attempt only."""
    if not all_events:
        return RunState(None)
    where = placed(all_events)
    subs = {s for s, _, e in where if e.kind is EventKind.SUBMITTED}
    current_sub = max(subs) if subs else 0
    out = RunState(None, events=[e for _, _, e in where], submissions=len(subs))  # placed's time order
    # one pass over the current submission (status folds 10,000 records): what each kind of event says
    current: List[Tuple[int, Event]] = []
    starts: List[Tuple[int, Event]] = []
    retried, requeued, failed, paused, kinds_all = set(), set(), set(), set(), set()
    last: Optional[int] = None  # the latest attempt with an event other than ``submitted``
    for s, a, e in where:
        if s != current_sub:
            continue
        current.append((a, e))
        kind = e.kind
        kinds_all.add(kind)
        if kind is EventKind.SUBMITTED:
            continue
        if last is None or a > last:
            last = a
        if kind is EventKind.STARTED:
            starts.append((a, e))
        elif kind is EventKind.RETRYING:
            retried.add(a)
        elif kind is EventKind.REQUEUED:
            requeued.add(a)
        elif kind is EventKind.FAILED:
            failed.add(a)
        elif kind is EventKind.PAUSED:
            paused.add(a)
    out.starts = len(starts)
    out.attempts = max((a for a, _ in starts), default=0)
    out.retries = len(retried)
    unrequeued = _requeue_failed(current) if requeued & failed else set()
    out.requeues = len(requeued - unrequeued)
    out.units = len({a for a in paused if a < out.attempts})
    if starts:
        out.started_at = min(e.time_ns for _, e in starts) / 1e9
        out.last_start = max(starts, key=lambda p: (p[0], p[1].time_ns, p[1].path))[1]
    final = next(((k, s) for k, s in _FINAL_EVENTS if k in kinds_all), None)
    if final is not None:
        out.state = final[1]
        out.ended_at = min(e.time_ns for _, e in current if e.kind is final[0]) / 1e9
        return out
    attempt = [e for a, e in current if a == last and e.kind is not EventKind.SUBMITTED] if last is not None else []
    kinds = {e.kind for e in attempt} - ({EventKind.REQUEUED} if last in unrequeued else set())
    out.state = next((s for k, s in _PRECEDENCE if k in kinds), State.QUEUED)
    if out.state in FAILURES:
        out.error, out.failed_rank = _cause([e for e in attempt if e.kind in _ERRORS[out.state]])
        out.ended_at = max(e.time_ns for e in attempt if e.kind is not EventKind.STARTED) / 1e9
    return out


def _requeue_failed(current: List[Tuple[int, Event]]) -> set:
    """The attempts whose requeue failed: a ``failed`` saying so beside their ``requeued`` (files opened only
    for attempts that hold both, which is rare)."""
    both = {a for a, e in current if e.kind is EventKind.REQUEUED} & {a for a, e in current if e.kind is EventKind.FAILED}
    return {a for a, e in current if a in both and e.kind is EventKind.FAILED
            and str(e.data().get("error") or "").find(REQUEUE_FAILED) >= 0}


def _cause(failures: List[Event]) -> Tuple[Optional[str], Optional[int]]:
    """The failing rank's own error wins over the fallout; then the lowest rank (order-independent)."""
    def key(pair: Tuple[Event, Dict[str, Any]]) -> Tuple[bool, int, str]:
        e, d = pair
        rank = e.rank if e.rank >= 0 else 1 << 30  # a rank's own words before the batch script's
        return bool(d.get("fallout")), rank, str(d.get("error") or "")

    details = sorted(((e, e.data()) for e in failures), key=key)
    if not details:
        return None, None
    e, d = details[0]
    return (str(d["error"]) if d.get("error") else None), (e.rank if e.rank >= 0 else None)
