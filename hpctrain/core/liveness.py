"""Whether a process is alive: one rule for the local launcher, review and the search's leases.

A process is ``ALIVE`` while it runs (a zombie has ended) and is the process that was recorded: one that
started after it was recorded (``started_by``), or whose command line does not name ``needle``, holds a
reused pid and is ``GONE``. A query that cannot be answered (no permission, an unreadable ``/proc``) is
``UNKNOWN``, never gone: a caller keeps what the process holds and asks again later. Slurm jobs are
asked through the queue (:mod:`hpctrain.slurm.query`), by the same rule.
"""

from dataclasses import dataclass
from enum import Enum
from typing import List, Optional

START_SLACK_S = 2.0  # a start time is known to about a second (the boot time in whole seconds, clock ticks)


class Liveness(Enum):
    ALIVE = "alive"  # it runs (or, for an owner, beats or is in the queue)
    GONE = "gone"  # known gone: no such process, a zombie, a reused pid, a job the queue answered without
    UNKNOWN = "unknown"  # the question failed: never read as gone


def process(pid: "int | str", started_by: Optional[float] = None, needle: Optional[str] = None) -> Liveness:
    """The process ``pid`` of this host. ``started_by``: a time it was known to run (it started no later);
    ``needle``: a word its command line holds. A pid that is no number (a Slurm job id) is no process: GONE."""
    if not str(pid).isdigit() or int(pid) <= 0:
        return Liveness.GONE
    import psutil  # here, not at import: status and hpctrain.load of a Slurm sweep never ask about a pid (~30 ms)

    try:
        proc = psutil.Process(int(pid))
        with proc.oneshot():
            if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return Liveness.GONE
            if started_by is not None and proc.create_time() > started_by + START_SLACK_S:
                return Liveness.GONE  # a later process with the recorded one's pid
            if needle is not None and needle not in " ".join(proc.cmdline()):
                return Liveness.GONE
    except psutil.NoSuchProcess:  # a zombie too (psutil.ZombieProcess)
        return Liveness.GONE
    except (psutil.AccessDenied, OSError):
        return Liveness.UNKNOWN
    return Liveness.ALIVE


@dataclass(frozen=True)
class Identity:
    start: float  # the process's start time (psutil's create_time): a later holder of the pid differs
    argv: List[str]


def identity(pid: int) -> Optional[Identity]:
    """The start time and argv of the live process ``pid``; None for none (or a zombie, or no permission)."""
    import psutil

    try:
        proc = psutil.Process(int(pid))
        with proc.oneshot():
            if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            return Identity(proc.create_time(), list(proc.cmdline()))
    except (psutil.Error, OSError):
        return None
