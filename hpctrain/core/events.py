"""A run's state: the states, the transitions (one small atomic file each), and the fold that reads them.

Every process that changes a run's state (the launcher, each rank's job wrapper, the trainer, the
batch script after ``srun``, ``hpctrain cancel``, a search sweeper) calls one of the transition
functions below. Each writes ONE new file into ``<run_dir>/.hpctrain/record/`` by temp-file-and-rename,
named ``<time_ns>.<kind>.<rank>.<unique>.json``; no file is ever rewritten, so two ranks or two
processes never read-modify-write the same file. The current state is :func:`fold` over those
files: a pure function, the same for any order in which the ranks of one attempt wrote theirs.

Transitions (and the state they lead to)::

    submitted(run_dir)                  -> queued     the launcher, before the job exists; starts a submission
    started(run_dir, job_id)            -> running    rank 0's job wrapper, each attempt
    failed(run_dir, error, rank)        -> failed     any rank whose task raised; ``fallout`` when the error is
                                                      only what a rank sees after another rank died
    retrying(run_dir, attempt, of)      -> retrying   the ONE decider after the attempt ended (see below)
    requeued(run_dir)                   -> requeued   checkpointed on preemption / time limit; Slurm requeues
    completed(run_dir, metrics)         -> completed
    timed_out(run_dir, error)           -> timeout    submitit gave up after ``max_num_timeout`` requeues
    cancelled(run_dir)                  -> cancelled  ``hpctrain cancel``
    pruned(run_dir, step, reason)       -> pruned     a search sweeper stopped it early

The fold, in words: only the events since the last ``submitted`` count (a rerun starts afresh);
``retrying`` and ``requeued`` end an attempt; within the current attempt the strongest event wins:
completed > pruned > cancelled > timeout > failed > running. A failed attempt's error is a rank's own
error over the collective fallout the other ranks saw (lowest rank first), whatever order they wrote in.

Retries: a crash of any rank ends its attempt ``failed``. After the attempt's tasks have all ended,
exactly one process decides (:func:`retry_allowed` then :func:`retrying`): the Slurm batch script after
``srun`` (``hpctrain.job.attempt_ended``) or the local launcher when the job's process ended.
The budget is the number of ``retrying`` events since the last ``submitted``.

One reader, :func:`read`, serves the retry budget, the skip of completed runs, ``wait=true``,
``status`` and ``report``. ``metrics.json`` stays the documented summary (``status``, ``step``,
``metrics``): :func:`write_summary` writes it, its ``status`` always taken from the record.

A file that cannot be read (a name that does not parse, garbage inside) is skipped; the rest stand.
No torch here: the login node reads this.
"""

import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from hpctrain.core import paths as runfiles

PathLike = Union[str, Path]
RECORD_DIR = os.path.join(".hpctrain", "record")
# Set by the launcher's job wrapper for the task function: the wrapper keeps the record of this run;
# an app run without it (``python -m hpctrain`` in run mode) keeps its own.
RECORDED_ENV = "HPCTRAIN_RECORDED"


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


ACTIVE = frozenset({State.QUEUED, State.RUNNING, State.REQUEUED, State.RETRYING})
FINAL = frozenset({State.COMPLETED, State.FAILED, State.TIMEOUT, State.CANCELLED, State.PRUNED})

# event kinds (file names) and the state each leaves the current attempt in
SUBMITTED, STARTED, FAILED, RETRYING, REQUEUED = "submitted", "started", "failed", "retrying", "requeued"
COMPLETED, TIMEOUT, CANCELLED, PRUNED = "completed", "timeout", "cancelled", "pruned"
KINDS = (SUBMITTED, STARTED, FAILED, RETRYING, REQUEUED, COMPLETED, TIMEOUT, CANCELLED, PRUNED)
_BOUNDARY = {RETRYING: State.RETRYING, REQUEUED: State.REQUEUED}  # these end an attempt
# within an attempt: the strongest event wins, whatever the order the ranks wrote in
_STRENGTH = [(COMPLETED, State.COMPLETED), (PRUNED, State.PRUNED), (CANCELLED, State.CANCELLED),
             (TIMEOUT, State.TIMEOUT), (FAILED, State.FAILED), (STARTED, State.RUNNING)]

# What a rank sees when another rank of the job died (gloo, NCCL): the fallout, not the cause.
FALLOUT_MARKERS = ("Connection closed by peer", "Connection reset by peer", "remote worker", "NCCL communicator",
                   "Watchdog caught collective operation timeout", "DistBackendError", "Broken pipe")


def is_fallout(error: str) -> bool:
    return any(marker in error for marker in FALLOUT_MARKERS)


# ---------------------------------------------------------------- events
@dataclass(frozen=True)
class Event:
    time_ns: int
    kind: str
    rank: int  # -1: not a rank (launcher, batch script, login node)
    path: str  # the file, read only when its details are needed

    def data(self) -> Dict[str, Any]:
        """The event's details; ``{}`` when the file is unreadable or not JSON (it still counts)."""
        return runfiles.read_json(self.path) or {}


def record_dir(run_dir: PathLike) -> str:
    return os.path.join(run_dir, RECORD_DIR)


def _write(run_dir: PathLike, kind: str, rank: int = -1, **details: Any) -> Event:
    """The one writer: a new file, complete or absent (temp file, then rename)."""
    assert kind in KINDS, kind
    now = time.time_ns()
    name = f"{now:020d}.{kind}.{rank}.{os.getpid()}-{secrets.token_hex(3)}.json"
    path = os.path.join(record_dir(run_dir), name)
    runfiles.write_json_atomic(Path(path), {"kind": kind, "time": now / 1e9, "rank": rank,
                                            "host": socket.gethostname(), **details})
    return Event(now, kind, rank, path)


def parse_name(name: str, directory: str = "") -> Optional[Event]:
    """``<time_ns>.<kind>.<rank>.<unique>.json`` -> Event; None for anything else (temp files, garbage)."""
    parts = name.split(".")
    if len(parts) != 5 or parts[4] != "json" or parts[1] not in KINDS:
        return None
    try:
        return Event(int(parts[0]), parts[1], int(parts[2]), os.path.join(directory, name))
    except ValueError:
        return None


def events(run_dir: PathLike) -> List[Event]:
    """The run's events in time order (file names only: nothing opened)."""
    directory = record_dir(run_dir)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [e for e in (parse_name(n, directory) for n in names) if e is not None]
    found.sort(key=lambda e: (e.time_ns, e.path))
    return found


# ---------------------------------------------------------------- transitions
def submitted(run_dir: PathLike, **details: Any) -> Event:
    return _write(run_dir, SUBMITTED, **details)


def started(run_dir: PathLike, job_id: Optional[str] = None, rank: int = 0, **details: Any) -> Event:
    return _write(run_dir, STARTED, rank, job_id=job_id, **details)


def failed(run_dir: PathLike, error: str, rank: int = -1, fallout: Optional[bool] = None,
           job_id: Optional[str] = None) -> Event:
    """A rank's task raised (or the batch script saw the tasks die): ``error`` is the traceback tail."""
    return _write(run_dir, FAILED, rank, error=error, job_id=job_id,
                  fallout=is_fallout(error) if fallout is None else fallout)


def retrying(run_dir: PathLike, attempt: int, of: int) -> Event:
    return _write(run_dir, RETRYING, attempt=attempt, of=of)


def requeued(run_dir: PathLike, rank: int = 0, **details: Any) -> Event:
    return _write(run_dir, REQUEUED, rank, **details)


def completed(run_dir: PathLike, rank: int = 0, **details: Any) -> Event:
    return _write(run_dir, COMPLETED, rank, **details)


def timed_out(run_dir: PathLike, error: str = "", rank: int = 0) -> Event:
    return _write(run_dir, TIMEOUT, rank, error=error)


def cancelled(run_dir: PathLike, by: str = "hpctrain cancel", job_id: Optional[str] = None) -> Event:
    return _write(run_dir, CANCELLED, by=by, job_id=job_id)


def pruned(run_dir: PathLike, step: Optional[int] = None, reason: str = "", rank: int = -1) -> Event:
    return _write(run_dir, PRUNED, rank, step=step, reason=reason)


# ---------------------------------------------------------------- the fold
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
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def final(self) -> bool:
        return self.state in FINAL


def fold(all_events: List[Event]) -> RunState:
    """The run's state from its events (sorted by time). Pure: opens the files of a failed attempt only."""
    if not all_events:
        return RunState(None)
    subs = [i for i, e in enumerate(all_events) if e.kind == SUBMITTED]
    current = all_events[subs[-1]:] if subs else all_events
    bounds = [i for i, e in enumerate(current) if e.kind in _BOUNDARY]
    attempt = current[bounds[-1] + 1:] if bounds else current
    kinds = {e.kind for e in attempt}
    out = RunState(None, events=all_events, submissions=len(subs))
    out.starts = sum(e.kind == STARTED for e in current)
    out.retries = sum(e.kind == RETRYING for e in current)
    out.requeues = sum(e.kind == REQUEUED for e in current)
    starts = [e for e in current if e.kind == STARTED]
    if starts:
        out.started_at = starts[0].time_ns / 1e9
        out.last_start = starts[-1]
    for kind, state in _STRENGTH:
        if kind in kinds:
            out.state = state
            break
    else:
        out.state = _BOUNDARY[current[bounds[-1]].kind] if bounds else State.QUEUED
    if out.state in (State.FAILED, State.TIMEOUT):
        out.error, out.failed_rank = _cause([e for e in attempt if e.kind in (FAILED, TIMEOUT)])
    if out.state in FINAL:
        out.ended_at = max(e.time_ns for e in attempt if e.kind not in (STARTED,)) / 1e9
    return out


def _cause(failures: List[Event]) -> "tuple[Optional[str], Optional[int]]":
    """The failing rank's own error wins over the fallout; then the lowest rank (order-independent)."""
    def key(pair: "tuple[Event, Dict[str, Any]]") -> "tuple[bool, int, int]":
        e, d = pair
        rank = e.rank if e.rank >= 0 else 1 << 30  # a rank's own words before the batch script's
        return bool(d.get("fallout")), rank, e.time_ns

    details = sorted(((e, e.data()) for e in failures), key=key)
    if not details:
        return None, None
    e, d = details[0]
    return (str(d["error"]) if d.get("error") else None), (e.rank if e.rank >= 0 else None)


def read(run_dir: Optional[PathLike]) -> RunState:
    """The run's current state: the one reader for retries, skips, waits, status and report."""
    return fold(events(run_dir)) if run_dir else RunState(None)


def state_of(run_dir: PathLike) -> Optional[str]:
    """The record's state, else (an older run, or none) metrics.json's ``status``."""
    state = read(run_dir).state
    if state is not None:
        return state.value
    return (runfiles.read_metrics(Path(run_dir)) or {}).get("status")


def is_completed(run_dir: PathLike, app: Optional[str] = None) -> bool:
    """Completed; with ``app`` (a fingerprint of the task function's code), completed by that same code:
    a rerun of an edited script runs again, a rerun after a crash skips what is done."""
    rs = read(run_dir)
    if rs.state is None:
        return (runfiles.read_metrics(Path(run_dir)) or {}).get("status") == State.COMPLETED.value
    if rs.state is not State.COMPLETED:
        return False
    if app is None:
        return True
    done = [e for e in rs.events if e.kind == COMPLETED][-1].data().get("app")
    return done is None or done == app


def app_fingerprint(task_function: Any) -> str:
    """The task function's name and a hash of its source file: what "the same app" means for reruns."""
    import hashlib
    import inspect

    name = f"{getattr(task_function, '__module__', '')}.{getattr(task_function, '__qualname__', '')}"
    try:
        with open(inspect.getsourcefile(task_function) or "", "rb") as f:
            digest = hashlib.sha1(f.read()).hexdigest()[:12]
    except (OSError, TypeError):
        digest = "?"
    return f"{name}@{digest}"


def retry_allowed(run_dir: PathLike, max_retries: int) -> Optional[int]:
    """For the one decider, after an attempt ended: the retry number to record, or None.

    Only a failed attempt is retried, while fewer than ``max_retries`` retries were used since the
    run was submitted.
    """
    rs = read(run_dir)
    if rs.state != State.FAILED or rs.retries >= max_retries:
        return None
    return rs.retries + 1


# ---------------------------------------------------------------- metrics.json, the summary
def write_summary(run_dir: PathLike, **fields: Any) -> Dict[str, Any]:
    """Merge ``fields`` (``step``, ``metrics``, ...) into metrics.json, with ``status`` and, for a failed
    run, ``error`` from the record. Written by one process at a time in practice (rank 0, then the job
    wrapper, then the batch script); whoever writes, the status is recomputed from the record.
    """
    path = Path(run_dir) / runfiles.METRICS
    summary = runfiles.read_json(path) or {}
    summary.update(fields)
    rs = read(run_dir)
    if rs.state is not None:
        summary["status"] = rs.state.value
        summary["restarts"] = rs.restarts
        if rs.state in (State.FAILED, State.TIMEOUT):
            summary["error"], summary["failed_rank"] = rs.error, rs.failed_rank
        elif rs.state in (State.RUNNING, State.COMPLETED):
            summary.pop("failed_rank", None)
            summary["error"] = None
    summary["updated"] = time.time()
    runfiles.write_json_atomic(path, summary)
    return summary


def numbers(value: Any) -> Dict[str, float]:
    """A task function's return value as metrics: a number -> ``{"value": x}``; a dict -> its numbers
    (nested ``metrics`` dicts included); anything else -> ``{}``."""
    if isinstance(value, bool):
        return {}
    if isinstance(value, (int, float)):
        return {"value": float(value)}
    try:  # numpy / torch scalars
        if hasattr(value, "item") and not hasattr(value, "keys"):
            return numbers(value.item())
    except (TypeError, ValueError):
        return {}
    if hasattr(value, "items"):
        out: Dict[str, float] = {}
        for k, v in value.items():
            if k == "metrics" and hasattr(v, "items"):
                out.update({str(kk): float(vv) for kk, vv in numbers(v).items()})
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                out[str(k)] = float(v)
        return out
    return {}
