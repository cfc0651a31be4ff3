"""What a job left behind besides its run record: its submitit logs and result; a local job's processes.

Nothing here unpickles anything (a result pickle may hold objects whose import is heavy or unsafe):
the outcome is read with pickletools (``hpctrain._compat.submitit.result_outcome``).

Stopping a local sweep: a process started in the background (``&``, nohup) ignores SIGINT, and so do
its children; submitit's tasks ignore SIGTERM on purpose (Slurm sends it before SIGKILL). So: SIGINT
where it is heard (the controller then stops its tasks itself, as submitit's own ``cancel`` does),
else the tasks are killed and the controller, whose tasks are gone, ends on its own.
"""

import os
import re
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional

from hpctrain._compat.submitit import log_path, result_outcome  # noqa: F401 - submitit's folder layout
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


GRACE_S = 5.0


def ignores(pid: int, sig: int) -> bool:
    """Whether ``pid`` ignores ``sig`` (the SigIgn mask of /proc/PID/status)."""
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def descendants(pid: int) -> List[int]:
    """Children, grandchildren, ... of ``pid`` (from /proc; empty where there is none)."""
    parents: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _kill_same(tree: Dict[int, bytes]) -> None:
    """SIGKILL the processes of ``tree`` still running the same command (a pid may have been reused)."""
    for pid, cmd in tree.items():
        if cmd and _cmdline(pid) == cmd:
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _wait_gone(pid: str, needle: str, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while pid_alive(pid, needle):
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_process(pid: str, needle: str) -> bool:
    """SIGINT if heard, else SIGTERM, then SIGKILL: True once the process is gone."""
    first = signal.SIGTERM if ignores(int(pid), signal.SIGINT) else signal.SIGINT
    for sig in (first, signal.SIGTERM, signal.SIGKILL):
        if not pid_alive(pid, needle):
            return True
        _signal(int(pid), sig)
        if _wait_gone(pid, needle, GRACE_S):
            return True
    return not pid_alive(pid, needle)


def stop_controller(pid: str) -> bool:
    """One local run: its submitit controller (``pid``) and every process under it."""
    if not pid_alive(pid, "submitit"):
        return True
    tree = {child: _cmdline(child) for child in descendants(int(pid))}
    if not ignores(int(pid), signal.SIGINT):
        _signal(int(pid), signal.SIGINT)  # the controller stops its tasks (SIGINT, then SIGKILL)
        if _wait_gone(pid, "submitit", GRACE_S):
            _kill_same(tree)  # strays, e.g. data loader workers of a task already gone
            return True
    _kill_same(tree)
    if _wait_gone(pid, "submitit", GRACE_S):  # its tasks gone, the controller ends by itself
        return True
    _signal(int(pid), signal.SIGKILL)
    return _wait_gone(pid, "submitit", GRACE_S)
