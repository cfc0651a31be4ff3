"""A run's life inside the allocation, owned by one object: load the payload, begin the attempt, end it once.

Whoever runs the task function builds the run's :class:`Lifecycle` and makes it current (:func:`active`): the
job wrapper (one sweep point; the packed runner's children run it too) and the search worker (a trial).
The app and the trainer ask for the current one (:func:`current`); only when run directly (``python -m
hpctrain`` in run mode, torchrun) does the app build its own. So exactly one writer records each start and
each end, whatever wraps the app; no environment variable decides it.

:meth:`Lifecycle.begin` skips a run already completed by the same code and writes ``started`` (rank 0).
:meth:`Lifecycle.end` maps what the attempt produced to its state through ONE table, :data:`DECISIONS`, and
writes that state's event and the summary (metrics.json, :mod:`hpctrain.core.summary`) once: a second
``end`` of the same attempt (the trainer recorded ``pruned``, then the worker settles the trial) writes
nothing and answers the first decision. What the attempt produced (:func:`outcome_of`)::

    what the attempt produced             outcome     state       retried? (decided after all tasks ended)
    returned, at max_steps                COMPLETED   completed   no (final)
    returned at a search unit's end       PAUSED      paused      no: a promotion starts the next unit
    the pruner / scheduler stopped it     PRUNED      pruned      no (final)
    an exception (any rank)               FAILED      failed      yes, within max_retries, unless deterministic
    submitit gave up at the time limit    TIMED_OUT   timeout     no (final)
    the preemption signal, checkpointed   REQUEUED    requeued    no: Slurm requeues the job, the run resumes
    no rank advanced (the watchdog)       HUNG        hung        yes, within max_retries (avoiding its nodes)

Each decision also says which ranks write it: the run's own outcome rank 0 only; an error each rank that
raised it (the fold prefers a rank's own error to the fallout the others saw). No torch here.
"""

import contextvars
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Union

from hpctrain.core import events, summary
from hpctrain.core.atomic import write_json_atomic
from hpctrain.core.paths import RunPaths
from hpctrain.core.state import State

PathLike = Union[str, Path]


class Outcome(str, Enum):
    COMPLETED = "completed"
    PAUSED = "paused"
    PRUNED = "pruned"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    REQUEUED = "requeued"
    HUNG = "hung"


@dataclass(frozen=True)
class EndRule:
    state: State
    write: Callable[..., Any]  # the event's writer (hpctrain.core.events)
    every_rank: bool  # written by each rank that saw it (an error), else by rank 0 only
    retried: bool  # whether the decider after the attempt (job/attempt_ended.py) may retry it
    why: str


DECISIONS: Dict[Outcome, EndRule] = {
    Outcome.COMPLETED: EndRule(State.COMPLETED, events.completed, False, False, "the task function returned"),
    Outcome.PAUSED: EndRule(State.PAUSED, events.paused, False, False, "a search unit ended before max_steps"),
    Outcome.PRUNED: EndRule(State.PRUNED, events.pruned, False, False, "the search stopped it early"),
    Outcome.FAILED: EndRule(State.FAILED, events.failed, True, True, "the task function raised"),
    Outcome.TIMED_OUT: EndRule(State.TIMEOUT, events.timed_out, True, False, "submitit gave up at the time limit"),
    Outcome.REQUEUED: EndRule(State.REQUEUED, events.requeued, False, False, "checkpointed on the preemption signal"),
    Outcome.HUNG: EndRule(State.HUNG, events.hung, True, True, "no rank advanced within its hang allowance"),
}


class Payload(NamedTuple):
    hydra_context: Any
    task_function: Any
    config: Any


def load_payload(path: PathLike) -> Payload:
    """The launch's pickled Hydra context, task function and sweep config; Hydra's globals set from it."""
    import cloudpickle
    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals

    with open(path, "rb") as f:
        hydra_context, task_function, config, singleton_state = cloudpickle.load(f)
    Singleton.set_state(singleton_state)
    setup_globals()
    return Payload(hydra_context, task_function, config)


@dataclass
class Lifecycle:
    """One attempt of one run, as this process sees it (``rank``); ``writes``: False on a rank whose
    record another process of the attempt keeps (a search worker's other ranks)."""

    run_dir: Path
    rank: int = 0
    job_id: Optional[str] = None
    app: Optional[str] = None  # the task function's fingerprint: a rerun of the same code skips completed runs
    writes: bool = True
    ended: Optional[State] = None  # what this attempt was decided to be (None: still running)
    why: str = ""
    said: bool = False  # the error was said in the job's log already (a full disk)
    started_with: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)

    # ---------------------------------------------------------------- begin
    def completed_before(self) -> bool:
        return events.is_completed(self.run_dir, self.app)

    def begin(self, skip_completed: bool = True, **details: Any) -> bool:
        """Start the attempt (``started`` on rank 0); False, nothing written, when the run is already
        completed by the same code (another job of the sweep, an earlier attempt) and ``skip_completed``."""
        if skip_completed and self.completed_before():
            self.ended, self.why = State.COMPLETED, "completed before: nothing to start"
            return False
        if self.writes:
            self._record_hardware(details)
        self.started_with = details
        return True

    def _record_hardware(self, details: Dict[str, Any]) -> None:
        """What this attempt runs on (:mod:`hpctrain.job.hardware`): rank 0's in its ``started`` and metrics.json,
        each other rank's in its own file (no rank reads or rewrites another's)."""
        from hpctrain.job import hardware

        facts = {**hardware.probe(), "key": events.slurm_key()}  # the Slurm job and restart: ranks matched by it
        if self.rank == 0:
            events.started(self.run_dir, job_id=self.job_id, **details, hardware=facts)
            summary.write(self.run_dir, hardware=facts)
            return
        path = RunPaths(self.run_dir).hardware / f"rank-{self.rank}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {**facts, "rank": self.rank, "time": time.time()})
        except OSError:  # a full disk: the run's facts, not its training; rank 0 records its own
            pass

    # ---------------------------------------------------------------- end
    def end(self, outcome: Outcome, *, error: str = "", step: Optional[int] = None, reason: str = "",
            event: Optional[Dict[str, Any]] = None, **fields: Any) -> State:
        """The attempt ends as ``outcome`` (see :data:`DECISIONS`): its event and the summary's ``fields``,
        written once; a later end of the same attempt writes nothing and answers the first decision."""
        decision = DECISIONS[outcome]
        if self.ended is not None:  # decided already (the trainer's pruned): the caller's summary fields only
            if fields and self.writes and self.rank == 0:
                summary.write(self.run_dir, **fields)
            return self.ended
        self.ended, self.why = decision.state, reason or decision.why
        if not self.writes or (self.rank != 0 and not decision.every_rank):
            return decision.state
        details = dict(event or {})
        if outcome is Outcome.FAILED:
            decision.write(self.run_dir, error, rank=self.rank, job_id=self.job_id)
        elif outcome is Outcome.TIMED_OUT:
            decision.write(self.run_dir, error, rank=self.rank)
        elif outcome is Outcome.HUNG:  # written by the watchdog, a process of its own (hpctrain.job.watchdog)
            decision.write(self.run_dir, error, rank=self.rank, job_id=self.job_id, **details)
        elif outcome is Outcome.PRUNED:
            decision.write(self.run_dir, step=step, reason=reason, rank=self.rank)
        elif outcome is Outcome.PAUSED:
            decision.write(self.run_dir, step=step, **details)
        elif outcome is Outcome.COMPLETED:
            decision.write(self.run_dir, **({"app": self.app} if self.app is not None else {}), **details)
        summary.write(self.run_dir, **fields)
        return decision.state

    def failed(self, exc: BaseException, **fields: Any) -> State:
        """An exception ended the attempt: submitit's give-up at the time limit is a timeout, else failed."""
        import submitit

        if isinstance(exc, submitit.core.utils.UncompletedJobError):
            return self.end(Outcome.TIMED_OUT, error=str(exc), **fields)
        return self.end(Outcome.FAILED, error=error_tail(exc), **fields)

    # ---------------------------------------------------------------- requeue
    def requeue(self, **details: Any) -> bool:
        """Checkpointed on the preemption signal: ``requeued`` and the summary; False, nothing written, when
        the record is final (completed, cancelled, pruned): the caller must not requeue the run."""
        return requeue(self.run_dir, **details)


def requeue(run_dir: PathLike, **details: Any) -> bool:
    """:meth:`Lifecycle.requeue` for a run whose lifecycle lives in another process (a packed task's child,
    cut short by its parent; submitit's checkpoint callback)."""
    if events.requeued(run_dir, **details) is None:
        return False
    summary.write(run_dir)
    return True


def outcome_of(ret: Any) -> "tuple[Outcome, Optional[BaseException]]":
    """What Hydra's ``run_job`` produced (a ``JobReturn``): completed, or the exception it holds."""
    from hydra.core.utils import JobStatus

    from hpctrain._compat.hydra import stored_value

    if ret.status == JobStatus.COMPLETED:
        return Outcome.COMPLETED, None
    exc = stored_value(ret)
    return Outcome.FAILED, exc if isinstance(exc, BaseException) else RuntimeError(str(exc))


_current: "contextvars.ContextVar[Optional[Lifecycle]]" = contextvars.ContextVar("hpctrain_lifecycle", default=None)


def current() -> Optional[Lifecycle]:
    """The lifecycle of the run this process is running, or None (the app was run directly)."""
    return _current.get()


@contextmanager
def active(lifecycle: Lifecycle) -> Iterator[Lifecycle]:
    token = _current.set(lifecycle)
    try:
        yield lifecycle
    finally:
        _current.reset(token)


def say(line: str) -> None:
    """A line on stderr (the job's log), which may itself sit on the full disk."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def error_tail(exc: BaseException, lines: int = 15) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "\n".join(text.rstrip().splitlines()[-lines:])
