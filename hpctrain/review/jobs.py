"""What a job left behind besides its run record: its submitit logs and result; a local job's processes.

Nothing here unpickles anything (a result pickle may hold objects whose import is heavy or unsafe):
the outcome is read with pickletools (``hpctrain._compat.submitit.result_outcome``).

Stopping a local run's processes: :mod:`hpctrain.core.stopping`.
"""

import os
import re
import time
from pathlib import Path
from typing import List, Optional

from hpctrain._compat.submitit import log_name, log_path, result_outcome  # noqa: F401 - submitit's folder layout
from hpctrain.core import safefs
from hpctrain.core import liveness
from hpctrain.core.liveness import Liveness
from hpctrain.core.paths import METRICS, SweepPaths
from hpctrain.core.state import State

# Slurm writes these into the job's stderr; submitit logs the last one when it gives up.
_MARKERS = [
    (State.TIMEOUT, re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT|timed-out too many times")),
    # "CANCELLED AT ... DUE TO NODE FAILURE": no one cancelled it
    (State.FAILED, re.compile(r"CANCELLED AT \S+ DUE TO NODE FAIL")),
    (State.CANCELLED, re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT")),
]


def is_timeout(text: str) -> bool:
    return bool(_MARKERS[0][1].search(text or ""))


def tail(path: str, max_bytes: int = 8192) -> str:
    """The log's last ``max_bytes``; a planted link or another user's file: one line saying so instead."""
    try:
        with open(safefs.open_read(path), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except safefs.UnsafeFile as exc:
        return f"hpctrain: {exc.strerror or exc}"
    except OSError:
        return ""


def tail_lines(path: str, n: int = 10) -> List[str]:
    lines = [line for line in tail(path).splitlines() if line.strip()]
    return lines[-n:]


# a requeue (a preemption, ours or submitit's) is not an end: the job ran again, its logs appended
_NOT_AN_END = re.compile(r"CANCELLED AT \S+ DUE TO (?:PREEMPTION|JOB REQUEUE)")
_MARKER_AT = re.compile(r"CANCELLED AT (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
# submitit's first line of every attempt: "submitit INFO (2026-12-02 02:57:28,714) - Starting with ..."
_ATTEMPT_AT = re.compile(r"\((\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),\d+\) - Starting with JobEnvironment")


def _marker_time(line: str) -> str:
    """The time a Slurm marker line gives (``CANCELLED AT <ISO>``); "~" (after any time) for other lines."""
    at = _MARKER_AT.search(line)
    return at.group(1) if at else "~"


def log_marker(folder: Path, job_id: str) -> Optional[State]:
    """Timeout, failed (node failure) or cancelled when Slurm or submitit wrote so in the job's logs for its
    last attempt: a line of an earlier attempt (a grace-time preemption's step cancel, before the job ran
    again: the logs are appended) or of a requeue says nothing about how the job ended."""
    err, out = tail(log_path(folder, job_id, "err"), 4096), tail(log_path(folder, job_id, "out"), 4096)
    starts = [f"{d}T{t}" for d, t in _ATTEMPT_AT.findall(out + err)]
    last_start = max(starts) if starts else ""
    text = "\n".join(line for line in (err + "\n" + out).splitlines()
                     if not _NOT_AN_END.search(line) and _marker_time(line) >= last_start)
    for state, pattern in _MARKERS:
        if pattern.search(text):
            return state
    return None


def pid_alive(pid: str, needle: str = "submitit") -> bool:
    """Not known gone (:func:`hpctrain.core.liveness.process`): a live process whose command line names
    ``needle`` (a reused pid does not), or one that cannot be asked about (unknown, never gone)."""
    return liveness.process(pid, needle=needle) is not Liveness.GONE


def parent_pid(pid: str) -> Optional[int]:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def local_launcher(controllers: List[str], recorded: Optional[int] = None) -> Optional[str]:
    """The live launcher of a local sweep: the pid its manifest records, or the parent of a live controller."""
    if recorded and pid_alive(str(recorded), "python"):
        return str(recorded)
    for pid in controllers:
        parent = parent_pid(pid)
        if parent and parent > 1 and pid_alive(str(parent), "python"):
            return str(parent)
    return None


def recently_active(sweep_dir: Path, run_dirs: List[str], within_s: float) -> bool:
    """Whether the sweep wrote anything lately (Hydra's multirun.yaml, a run's metrics.json)."""
    now = time.time()
    # plain strings: a thousand-run sweep asks this on every status
    paths = [str(SweepPaths(sweep_dir).multirun_yaml)] + [os.path.join(d, METRICS) for d in run_dirs]
    for path in paths:
        try:
            if 0 <= now - os.stat(path).st_mtime < within_s:  # a future mtime is no sign of life
                return True
        except OSError:
            continue
    return False
