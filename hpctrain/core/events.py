"""A run's event log: one small file per event, appended, never rewritten (write, list, read).

Every process that changes a run's state (the launcher, each rank's job wrapper, the trainer, the
batch script after ``srun``, ``hpctrain cancel``, a search sweeper) calls one of the transition
functions below. Each writes ONE new file into ``<run_dir>/.hpctrain/record/`` by temp-file-and-rename,
named ``<time_ns>.<kind>.<rank>.<unique>.json``, where ``<unique>`` is ``<pid>-<hex>~s<N>~a<M>[~k<job>r<n>]``:
the submission and attempt the writer belongs to, and in a Slurm job its job id and restart count, so that
the fold never needs the writers' clocks to agree (see :mod:`hpctrain.core.state`). No file is ever rewritten, so two ranks or two
processes never read-modify-write the same file. The current state is the fold over those files
(:func:`hpctrain.core.state.fold`): a pure function, the same for any order in which the ranks of one
attempt wrote theirs.

Transitions (and the state they lead to)::

    submitted(run_dir)                  -> queued     the launcher, before the job exists; starts a submission
                                                      (``submitted_all``: a whole submission's runs at once)
    started(run_dir, job_id)            -> running    rank 0's job wrapper, each attempt
    failed(run_dir, error, rank)        -> failed     any rank whose task raised; ``fallout`` when the error is
                                                      only what a rank sees after another rank died
    retrying(run_dir, attempt, of)      -> retrying   the ONE decider after the attempt ended (see below)
    requeued(run_dir)                   -> requeued   checkpointed on preemption / time limit; Slurm requeues
                                                      (not written, None, when the record is final: the
                                                      caller must not requeue a completed or cancelled run)
    completed(run_dir, metrics)         -> completed
    timed_out(run_dir, error)           -> timeout    submitit gave up after ``max_num_timeout`` requeues
    cancelled(run_dir)                  -> cancelled  ``hpctrain cancel``
    pruned(run_dir, step, reason)       -> pruned     a search sweeper stopped it early
    paused(run_dir, step)               -> paused     a search trial at its unit's end step (checkpointed);
                                                      the next ``started`` (a promotion) resumes it
    straggler(run_dir, rank, node, ...) -> (unchanged) rank 0 flagged a rank persistently slower than the
                                                      others (hpctrain.job.straggler)

Retries: a crash of any rank ends its attempt ``failed``. After the attempt's tasks have all ended,
exactly one process decides (:func:`retry_allowed` then :func:`retrying`): the Slurm batch script after
``srun`` (``hpctrain.job.attempt_ended``) or the local launcher when the job's process ended.
The budget is the number of ``retrying`` events since the last ``submitted``.

One reader, :func:`read`, serves the retry budget, the skip of completed runs, ``wait=true``,
``status`` and ``report``. metrics.json, the documented summary, is written by hpctrain.core.summary.

A file that cannot be read (a name that does not parse, garbage inside) is skipped; the rest stand.
No torch here: the login node reads this.
"""

import json
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from hpctrain.core.errors import deterministic, disk_full
from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import HPCTRAIN_DIR, METRICS, RECORD_DIR, RunPaths
from hpctrain.core.state import Event, EventKind, RunState, State, fold, placed

PathLike = Union[str, Path]

# What a rank sees when another rank of the job died (gloo, NCCL): the fallout, not the cause.
FALLOUT_MARKERS = ("Connection closed by peer", "Connection reset by peer", "remote worker", "NCCL communicator",
                   "Watchdog caught collective operation timeout", "DistBackendError", "Broken pipe")


def is_fallout(error: str) -> bool:
    return any(marker in error for marker in FALLOUT_MARKERS)


def record_dir(run_dir: PathLike) -> str:
    # RunPaths(run_dir).record as a plain string: pathlib costs ~40 us a call, which status on 10,000 runs feels
    return os.path.join(run_dir, RECORD_DIR)


_KEY = re.compile(r"^[0-9_]+r[0-9]+$")
_own_attempt: Dict[str, Tuple[int, int]] = {}  # record dir -> (submission, attempt) this process started


def slurm_key() -> Optional[str]:
    """This process's Slurm job and restart count (``123_4r1``): the same on every rank and in the batch
    script of one attempt; None outside Slurm."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{job}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}" if job else os.environ.get("SLURM_JOB_ID")
    key = f"{job}r{os.environ.get('SLURM_RESTART_COUNT') or 0}" if job else None
    return key if key and _KEY.match(key) else None


def _last_submission(names: Iterable[str]) -> int:
    """The record's latest submission number, from its ``submitted`` file names alone (as :func:`placed`
    numbers them: the tag, else an untagged one's count in time order); 0 for none."""
    subs = sorted((e for e in (parse_name(n) for n in names if f".{EventKind.SUBMITTED.value}." in n)
                   if e is not None and e.kind is EventKind.SUBMITTED), key=lambda e: (e.time_ns, e.path))
    return max((e.submission if e.submission is not None else n for n, e in enumerate(subs, 1)), default=0)


def _names(directory: str) -> List[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _tags(directory: str, kind: EventKind) -> str:
    """The submission and attempt as this writer sees them (counts of tags: no clock involved)."""
    if kind is EventKind.SUBMITTED:  # a new submission needs only the last one's number: no fold
        return f"~s{_last_submission(_names(directory)) + 1}~a0"
    rs = fold(_events_in(directory))
    sub = max((s for s, _, e in placed(rs.events) if e.kind is EventKind.SUBMITTED), default=0)
    own = _own_attempt.get(directory)
    attempt = own[1] if own is not None and own[0] == sub else rs.attempts  # its own start, not another's
    if kind is EventKind.STARTED:
        attempt = rs.attempts + 1
        _own_attempt[directory] = (sub, attempt)
    elif kind is EventKind.FAILED and rs.state is State.RETRYING:
        attempt = rs.attempts + 1  # the retry's tasks died before its run started: that attempt failed, not the last
    key = slurm_key()
    return f"~s{sub}~a{attempt}" + (f"~k{key}" if key else "")


def _write(run_dir: PathLike, kind: EventKind, rank: int = -1, **details: Any) -> Event:
    """The one writer: a new file, complete or absent (temp file, then rename)."""
    kind = EventKind(kind)
    directory = record_dir(run_dir)
    tags = _tags(directory, kind)
    now = time.time_ns()
    name = f"{now:020d}.{kind.value}.{rank}.{os.getpid()}-{secrets.token_hex(3)}{tags}.json"
    path = os.path.join(directory, name)
    write_json_atomic(path, {"kind": kind.value, "time": now / 1e9, "rank": rank,
                             "host": socket.gethostname(), **details})
    return parse_name(name, directory) or Event(now, kind, rank, path)


def submitted_all(run_dirs: Iterable[PathLike], **details: Any) -> None:
    """:func:`submitted` for every run of a submission at once, the same files in the same places, written
    in bulk: the host and pid read once, each record dir made with one ``mkdir`` a level, its names listed
    once (a new run's: none) instead of the per-write fold, the JSON by the C encoder, no chmod (the file is
    created with its final mode). Still one complete-or-absent file per run (temp name, then rename)."""
    stem = f".{EventKind.SUBMITTED.value}.-1.{os.getpid()}-"
    body = {"kind": EventKind.SUBMITTED.value, "rank": -1, "host": socket.gethostname(), **details}
    for run_dir in run_dirs:
        directory = record_dir(run_dir)
        names = _make_record_dir(str(run_dir), directory)
        now = time.time_ns()
        name = f"{now:020d}{stem}{secrets.token_hex(3)}~s{_last_submission(names) + 1}~a0.json"
        path = os.path.join(directory, name)
        tmp = os.path.join(directory, f".{name}.tmp")  # a name parse_name skips
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for every file
            try:
                os.write(fd, json.dumps({**body, "time": now / 1e9}, sort_keys=True, default=str).encode())
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise disk_full(exc, directory) or exc


def _make_record_dir(run_dir: str, directory: str) -> List[str]:
    """Make ``<run_dir>/.hpctrain/record`` (one ``mkdir`` a level); the names already in it (a rerun's)."""
    made = False
    for level in (run_dir, os.path.join(run_dir, HPCTRAIN_DIR), directory):
        try:
            os.mkdir(level)
            made = True
        except FileExistsError:
            continue
        except FileNotFoundError:  # a run dir nested deeper under the sweep dir
            os.makedirs(directory, exist_ok=True)
            return []
    return [] if made else _names(directory)


def parse_name(name: str, directory: str = "") -> Optional[Event]:
    """``<time_ns>.<kind>.<rank>.<unique>.json`` -> Event; None for anything else (temp files, garbage).
    Tags in ``<unique>`` (``~s2~a3~k123_4r1``) place it; a name without them is placed by its time."""
    parts = name.split(".")
    if len(parts) != 5 or parts[4] != "json":
        return None
    kind = _KINDS.get(parts[1])
    if kind is None:
        return None
    sub = att = key = None
    # plain string work, no regex or Enum call: status on 10,000 runs parses ~30,000 of these
    for piece in parts[3].split("~")[1:]:
        tag, text = piece[:1], piece[1:]
        if not text:
            continue
        if tag == "s":
            sub = int(text) if text.isdigit() else None
        elif tag == "a":
            att = int(text) if text.isdigit() else None
        elif tag == "k":
            key = text
    try:
        when, rank = int(parts[0]), int(parts[2])
    except ValueError:
        return None
    path = name if not directory else (directory + name if directory.endswith("/") else f"{directory}/{name}")
    return Event(when, kind, rank, path, sub, att, key)


_KINDS = {k.value: k for k in EventKind}


def _events_in(directory: str) -> List[Event]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [e for e in (parse_name(n, directory) for n in names) if e is not None]
    found.sort(key=lambda e: (e.time_ns, e.path))
    return found


def events(run_dir: PathLike) -> List[Event]:
    """The run's events in time order (file names only: nothing opened)."""
    return _events_in(record_dir(run_dir))


# ---------------------------------------------------------------- transitions
def submitted(run_dir: PathLike, **details: Any) -> Event:
    return _write(run_dir, EventKind.SUBMITTED, **details)


def started(run_dir: PathLike, job_id: Optional[str] = None, rank: int = 0, **details: Any) -> Event:
    """A new attempt (the next number after the highest the record holds); Slurm's restart count with it."""
    restart = os.environ.get("SLURM_RESTART_COUNT")
    extra = {"slurm_restart_count": int(restart)} if restart and restart.isdigit() else {}
    return _write(run_dir, EventKind.STARTED, rank, job_id=job_id, **{**extra, **details})


def failed(run_dir: PathLike, error: str, rank: int = -1, fallout: Optional[bool] = None,
           job_id: Optional[str] = None) -> Event:
    """A rank's task raised (or the batch script saw the tasks die): ``error`` is the traceback tail."""
    return _write(run_dir, EventKind.FAILED, rank, error=error, job_id=job_id,
                  fallout=is_fallout(error) if fallout is None else fallout)


def hung(run_dir: PathLike, error: str, rank: int = -1, job_id: Optional[str] = None, **details: Any) -> Event:
    """The watchdog ended a hung attempt: ``error`` is its one line (ranks, nodes, the top frame); ``details``
    the ranks, nodes and stack files it names (hpctrain.job.watchdog)."""
    return _write(run_dir, EventKind.HUNG, rank, error=error, job_id=job_id, **details)


def straggler(run_dir: PathLike, rank: int, node: str, factor: float, step: int, **details: Any) -> Event:
    """Rank 0 flagged ``rank`` (on ``node``) as a straggler of this attempt: its own work per step was
    ``factor`` x the other ranks' median for several log windows (hpctrain.job.straggler). The state stays."""
    return _write(run_dir, EventKind.STRAGGLER, 0, straggler_rank=rank, node=node, factor=factor, step=step,
                  **details)


def retrying(run_dir: PathLike, attempt: int, of: int, **details: Any) -> Event:
    return _write(run_dir, EventKind.RETRYING, attempt=attempt, of=of, **details)


def requeued(run_dir: PathLike, rank: int = 0, **details: Any) -> Optional[Event]:
    """Checkpointed for a requeue; None, nothing written, when the record is final (completed, cancelled,
    pruned): the caller then must not requeue the run. Records the step the run stopped at (metrics.json's)
    and the step of the checkpoint it will resume from (:func:`checkpoint_at`), where known: the steps
    between them are trained again."""
    if read(run_dir).final:
        return None
    facts = {"step": (read_json(os.path.join(run_dir, METRICS)) or {}).get("step"),
             "checkpoint_step": _checkpoint_at.get(os.path.abspath(run_dir))}
    return _write(run_dir, EventKind.REQUEUED, rank, **{**facts, **details})


_checkpoint_at: Dict[str, int] = {}  # run dir -> the step of the newest checkpoint this process saved or loaded


def checkpoint_at(run_dir: PathLike, step: int) -> None:
    """The run's newest complete checkpoint is at ``step`` (the checkpointer saved or resumed from it); a
    requeue written later in this process records it."""
    _checkpoint_at[os.path.abspath(run_dir)] = int(step)


def completed(run_dir: PathLike, rank: int = 0, **details: Any) -> Event:
    return _write(run_dir, EventKind.COMPLETED, rank, **details)


def timed_out(run_dir: PathLike, error: str = "", rank: int = 0) -> Event:
    return _write(run_dir, EventKind.TIMEOUT, rank, error=error)


def cancelled(run_dir: PathLike, by: str = "hpctrain cancel", job_id: Optional[str] = None) -> Event:
    return _write(run_dir, EventKind.CANCELLED, by=by, job_id=job_id)


def pruned(run_dir: PathLike, step: Optional[int] = None, reason: str = "", rank: int = -1) -> Event:
    return _write(run_dir, EventKind.PRUNED, rank, step=step, reason=reason)


def paused(run_dir: PathLike, step: Optional[int] = None, rank: int = 0, **details: Any) -> Event:
    return _write(run_dir, EventKind.PAUSED, rank, step=step, **details)


# ---------------------------------------------------------------- reading
def read(run_dir: Optional[PathLike]) -> RunState:
    """The run's current state: the one reader for retries, skips, waits, status and report."""
    return fold(events(run_dir)) if run_dir else RunState(None)


def _summary_status(run_dir: PathLike) -> Optional[State]:
    """metrics.json's ``status``: the state of a run without a record (an older run, a foreign app)."""
    return State.parse((read_json(RunPaths(run_dir).metrics) or {}).get("status"))


def state_of(run_dir: PathLike) -> Optional[State]:
    """The record's state, else (an older run, or none) metrics.json's ``status``."""
    state = read(run_dir).state
    return state if state is not None else _summary_status(run_dir)


def is_completed(run_dir: PathLike, app: Optional[str] = None) -> bool:
    """Completed; with ``app`` (a fingerprint of the task function's code), completed by that same code:
    a rerun of an edited script runs again, a rerun after a crash skips what is done."""
    rs = read(run_dir)
    if rs.state is None:
        return _summary_status(run_dir) is State.COMPLETED
    if rs.state is not State.COMPLETED:
        return False
    if app is None:
        return True
    done = [e for e in rs.events if e.kind is EventKind.COMPLETED][-1].data().get("app")
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

    Only a failed or hung attempt is retried, while fewer than ``max_retries`` retries were used since the
    run was submitted, and only when a retry can fix it (:func:`hpctrain.core.errors.deterministic`; a hang
    always may: a stuck peer, link or file system read is the machine's).
    """
    rs = read(run_dir)
    if rs.state is State.HUNG:
        return rs.retries + 1 if rs.retries < max_retries else None
    if rs.state is not State.FAILED or rs.retries >= max_retries or deterministic(rs.error):
        return None
    return rs.retries + 1
