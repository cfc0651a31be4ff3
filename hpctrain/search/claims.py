"""A trial's lease as files: the claim files that say who runs a trial, its heartbeat, the short lock.

A trial's lease is a series of claim files ``<sweep>/.hpctrain/trials/<n>.<gen>.claim`` (``<n>.json`` is a
readable copy of the newest, read by nobody); the claim of the highest generation ``gen`` is the lease
(:class:`Lease`). A claim is created whole and exclusively (a hard link), so of two workers claiming the
same generation exactly one wins, even when the lock was broken. A holder touches
``<n>.<owner>.alive`` every ``heartbeat_s``. The protocol over these files: :mod:`hpctrain.search.leases`.

On disk a claim is a JSON object: ``owner``, ``host``, ``pid``, ``since`` (the claim's time), ``gen``,
``number``, ``adoptions``, the owner's ``slurm_job_id`` and ``worker``, the ``unit`` it runs
(:meth:`hpctrain.search.units.Unit.fields`), ``step`` (where a paused or ended trial stopped) and, for a
claim that is not a holder's, one of ``"released": true``, ``"paused": true``, ``"ended": true``.
"""

import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Collection, Dict, Iterator, Optional

from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.search import journal
from hpctrain.search.units import Unit

LOCK_GRACE_S = 30  # a lock file untouched this long was left by a killed process: broken
LOCK_GRACE_ENV = "HPCTRAIN_SEARCH_LOCK_GRACE_S"  # tests shorten the grace period


class Mark(Enum):
    """What a generation of a lease says of its trial."""

    HELD = "held"  # its owner runs it
    RELEASED = "released"  # let go unfinished at a time limit: anyone resumes it, no adoption counted
    PAUSED = "paused"  # between units: the scheduler's to resume, nobody's to adopt
    ENDED = "ended"  # being ended pruned (its ender tells the study next)

    @property
    def resting(self) -> bool:
        """No owner runs it."""
        return self in (Mark.PAUSED, Mark.ENDED)


@dataclass(frozen=True)
class Lease:
    """A trial's current lease: its claim of the highest generation."""

    number: int
    gen: int
    owner: str
    host: str = ""
    pid: Optional[int] = None
    since: float = 0.0  # when it was claimed (the owner's process ran then)
    adoptions: int = 0  # takeovers of a dead owner's trial so far (a release counts none)
    slurm_job_id: Optional[str] = None  # the owner's job; None: a local process (host, pid)
    worker: Optional[int] = None
    unit: Optional[Unit] = None  # what the holder runs, or ran to (paused, ended)
    step: Optional[int] = None  # where a paused or ended trial stopped
    mark: Mark = Mark.HELD

    @property
    def local(self) -> bool:
        """Held by a process of this host, not a Slurm job (its pid can be asked about)."""
        return not self.slurm_job_id and self.host == socket.gethostname() and bool(self.pid)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"owner": self.owner, "host": self.host, "pid": self.pid, "since": self.since,
                               "gen": self.gen, "number": self.number, "adoptions": self.adoptions}
        for key, value in (("slurm_job_id", self.slurm_job_id), ("worker", self.worker), ("step", self.step)):
            if value is not None:
                out[key] = value
        if self.unit is not None:
            out["unit"] = self.unit.fields()
        if self.mark is not Mark.HELD:
            out[self.mark.value] = True
        return out

    @classmethod
    def from_json(cls, number: int, gen: int, data: Dict[str, Any]) -> "Lease":
        """A claim file's content (``number`` and ``gen`` from its name: the file is the truth)."""
        mark = next((m for m in (Mark.RELEASED, Mark.PAUSED, Mark.ENDED) if data.get(m.value)), Mark.HELD)
        unit = data.get("unit")
        job, worker, step = data.get("slurm_job_id"), data.get("worker"), data.get("step")
        return cls(number, gen, str(data.get("owner", "")), str(data.get("host", "")),
                   int(data["pid"]) if data.get("pid") else None, float(data.get("since") or 0),
                   int(data.get("adoptions") or 0), str(job) if job else None,
                   int(worker) if worker is not None else None,
                   Unit.from_fields(unit) if isinstance(unit, dict) else None,
                   int(step) if step is not None else None, mark)


Claims = Dict[str, Lease]  # claim files read before (path -> lease): a claim is never written again


def lock_grace_s() -> int:
    return int(os.environ.get(LOCK_GRACE_ENV) or LOCK_GRACE_S)


class ClaimsDir(str):
    """A directory of claim files given as such (a grid submission's points), where the functions below
    otherwise take a sweep dir and use its search's ``trials`` dir."""


def leases_dir(sweep_dir: "str | Path") -> str:
    return str(sweep_dir) if isinstance(sweep_dir, ClaimsDir) else str(SweepPaths(sweep_dir).trials)


def lease_path(sweep_dir: "str | Path", number: int) -> str:
    """The readable copy of a trial's current lease (the claim files are the truth)."""
    return os.path.join(leases_dir(sweep_dir), f"{number}.json")


def claim_path(sweep_dir: "str | Path", number: int, gen: int) -> str:
    return os.path.join(leases_dir(sweep_dir), f"{number}.{gen}.claim")


def alive_path(sweep_dir: "str | Path", number: int, owner: str) -> str:
    return os.path.join(leases_dir(sweep_dir), f"{number}.{owner.replace('/', '_')}.alive")


def read_leases(sweep_dir: "str | Path", claims: Optional[Claims] = None,
                only: Optional[Collection[int]] = None) -> Dict[int, Lease]:
    """Every trial's current lease (``only``: of those numbers): its claim of the highest generation (one
    directory listing). ``claims``: the claim files read before, kept by the caller: a claim file is created
    whole and never written again (a new generation is a new file), so its content is read once."""
    newest: Dict[int, int] = {}
    try:
        names = os.listdir(leases_dir(sweep_dir))
    except OSError:
        return {}
    for name in names:
        parts = name.split(".")
        if len(parts) == 3 and parts[2] == "claim" and parts[0].isdigit() and parts[1].isdigit():
            number, gen = int(parts[0]), int(parts[1])
            if only is not None and number not in only:
                continue
            newest[number] = max(gen, newest.get(number, 0))
    out: Dict[int, Lease] = {}
    for number, gen in newest.items():
        path = claim_path(sweep_dir, number, gen)
        lease = claims.get(path) if claims is not None else None
        if lease is None:
            lease = read_claim(path, number, gen)
            if lease is not None and claims is not None:
                claims[path] = lease
        if lease is not None:
            out[number] = lease
    return out


def read_claim(path: str, number: int, gen: int) -> Optional[Lease]:
    """A claim file's lease; None while it cannot be read whole (seen before its content, on another host)."""
    data = read_json(path)
    try:
        return Lease.from_json(number, gen, data) if isinstance(data, dict) else None
    except (TypeError, ValueError, KeyError):
        return None


def read_lease(sweep_dir: "str | Path", number: int, claims: Optional[Claims] = None) -> Optional[Lease]:
    return read_leases(sweep_dir, claims).get(number)


def claim(sweep_dir: "str | Path", number: int, gen: int, owner: str, now: float, *, adoptions: int = 0,
          unit: Optional[Unit] = None, mark: Mark = Mark.HELD, step: Optional[int] = None,
          slurm_job_id: Optional[str] = None, worker: Optional[int] = None, pid: Optional[int] = None,
          copy: bool = True) -> Optional[Lease]:
    """Make ``owner`` the holder of generation ``gen`` of the trial's lease, or None when someone else
    claimed that generation first. The claim file is created whole and exclusively (a hard link fails
    when the name exists, on NFS too), so two claimants of one generation never both win, lock or no lock."""
    os.makedirs(leases_dir(sweep_dir), exist_ok=True)
    lease = Lease(number, gen, owner, socket.gethostname(), os.getpid() if pid is None else pid, now, adoptions,
                  slurm_job_id, worker, unit, step, mark)
    path = claim_path(sweep_dir, number, gen)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w") as f:
        json.dump(lease.to_json(), f, default=str)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        won = True
    except FileExistsError:
        won = os.stat(tmp).st_nlink == 2  # NFS: a retried link answers EEXIST although it was ours
    finally:
        os.unlink(tmp)
    if not won:
        return None
    if copy:  # a grid's points skip it: read by nobody, and a second file written per point
        write_json_atomic(Path(lease_path(sweep_dir, number)), lease.to_json())
    touch(alive_path(sweep_dir, number, owner), now)
    return lease


def touch(path: str, now: Optional[float] = None) -> None:
    with open(path, "a"):
        os.utime(path, None if now is None else (now, now))


def heartbeat_age(sweep_dir: "str | Path", number: int, owner: str, now: Optional[float] = None) -> float:
    try:
        return (time.time() if now is None else now) - os.stat(alive_path(sweep_dir, number, owner)).st_mtime
    except OSError:
        return float("inf")


@contextmanager
def trials_lock(sweep_dir: "str | Path") -> Iterator[None]:
    """A short lock for quick decisions (never held across a slow call). It may be broken by a waiter
    after its grace period: what must not be decided twice is fenced by :func:`claim`, not by it."""
    lock = journal.PromptOpenLock(str(SweepPaths(sweep_dir).trials), grace_period=lock_grace_s())
    lock.acquire()
    try:
        yield
    finally:
        try:
            lock.release()
        except RuntimeError:
            pass  # broken by a waiter while we held it: our claims were fenced all the same


class Heartbeat:
    """Touches a lease's alive file every ``interval_s`` while its holder runs it (a daemon thread)."""

    def __init__(self, path: str, interval_s: float) -> None:
        self.path, self.interval_s = path, interval_s
        self._stop = threading.Event()
        touch(path)
        self._thread = threading.Thread(target=self._beat, name="hpctrain-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                touch(self.path)
            except OSError:
                pass  # shared storage hiccup: the next beat tries again

    def stop(self) -> None:
        self._stop.set()
