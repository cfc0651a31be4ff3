"""What a job left behind besides metrics.json: its submitit logs and result, its process, our cancel record.

Nothing here unpickles anything (a result pickle may hold objects whose import is heavy or unsafe):
the outcome is read from the pickle's first bytes, ``("success", ...)`` or ``("error", ...)``.
"""

import os
import re
import time
from pathlib import Path
from typing import Dict, List, Optional

from hpctrain import runfiles

CANCELLED_FILE = Path(".hpctrain") / "cancelled.json"

# Slurm writes these into the job's stderr; submitit logs the last one when it gives up.
_MARKERS = [
    ("timeout", re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT|timed-out too many times")),
    ("cancelled", re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT")),
]


def is_timeout(text: str) -> bool:
    return bool(_MARKERS[0][1].search(text or ""))


def log_path(folder: Path, job_id: str, stream: str = "out") -> str:
    """submitit's log of rank 0: ``<folder>/<job_id>_0_log.out`` (``<array>_<task>_0_log.out`` for arrays)."""
    return os.path.join(folder, f"{job_id}_0_log.{stream}")  # a plain string: status builds thousands


def tail(path: str, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def tail_lines(path: str, n: int = 10) -> List[str]:
    lines = [line for line in tail(path).splitlines() if line.strip()]
    return lines[-n:]


def log_marker(folder: Path, job_id: str) -> Optional[str]:
    """``"timeout"`` or ``"cancelled"`` when Slurm or submitit wrote so at the end of the job's logs."""
    text = tail(log_path(folder, job_id, "err"), 4096) + tail(log_path(folder, job_id, "out"), 4096)
    for state, pattern in _MARKERS:
        if pattern.search(text):
            return state
    return None


def result_outcome(folder: Path, job_id: str) -> Optional[str]:
    """``"success"``/``"error"`` from submitit's result pickle of rank 0, None when there is none."""
    try:
        with open(Path(folder) / f"{job_id}_0_result.pkl", "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    found = {word: head.find(word.encode()) for word in ("success", "error")}
    found = {word: at for word, at in found.items() if at >= 0}
    return min(found, key=found.get) if found else None  # the tuple's first item comes first


def pid_alive(pid: str, needle: str = "submitit") -> bool:
    """A live (not zombie) process whose command line mentions ``needle`` (guards against reused pids)."""
    if not str(pid).isdigit():
        return False
    proc = Path("/proc") / str(pid)
    if not Path("/proc/self").exists():  # no procfs (macOS): signal 0 is all there is
        try:
            os.kill(int(pid), 0)
            return True
        except OSError:
            return False
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X") and needle in cmdline


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
    """Whether the sweep wrote anything lately (Hydra's multirun.yaml, run events, a run's metrics.json)."""
    now = time.time()
    events = os.path.join(sweep_dir, ".hpctrain", "events")
    paths = [os.path.join(sweep_dir, "multirun.yaml"), events] + [os.path.join(d, "metrics.json") for d in run_dirs]
    try:
        paths += [os.path.join(events, name) for name in os.listdir(events)]
    except OSError:
        pass
    for path in paths:
        try:
            if now - os.stat(path).st_mtime < within_s:
                return True
        except OSError:
            continue
    return False


def read_cancelled(sweep_dir: Path) -> Dict[str, Dict]:
    """``{job_id: {"run": idx, "time": t}}`` for every job `hpctrain cancel` cancelled in this sweep."""
    return runfiles.read_json(Path(sweep_dir) / CANCELLED_FILE) or {}


def record_cancelled(sweep_dir: Path, runs: Dict[str, int]) -> None:
    """Add ``{job_id: run idx}`` to the sweep's cancel record (status shows those runs as cancelled)."""
    record = read_cancelled(sweep_dir)
    now = time.time()
    for job_id, idx in runs.items():
        record[str(job_id)] = {"run": idx, "time": now}
    runfiles.write_json_atomic(Path(sweep_dir) / CANCELLED_FILE, record)
