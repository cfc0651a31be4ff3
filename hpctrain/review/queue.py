"""What Slurm says about a sweep's jobs: squeue first (always there), sacct when accounting exists."""

import re
import shutil
import subprocess
from typing import Dict, Iterable, List, Optional, Tuple


def have_slurm() -> bool:
    return shutil.which("squeue") is not None


def squeue_states(job_ids: Iterable[str]) -> Dict[str, Tuple[str, str]]:
    """``{"123_4": ("PENDING", "Priority"), "125": ("RUNNING", "None")}`` for jobs still in the queue.

    ``-r`` prints one line per array task (otherwise pending tasks are squashed into ``123_[4-9]``).
    """
    ids = sorted({str(j).split("_")[0] for j in job_ids if j})
    if not ids or not have_slurm():
        return {}
    proc = subprocess.run(
        ["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i|%T|%r"],
        capture_output=True, text=True, timeout=30,
    )
    out: Dict[str, Tuple[str, str]] = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            out[parts[0]] = (parts[1], parts[2])
    return out


def sacct_states(job_ids: Iterable[str]) -> Dict[str, str]:
    """Final states from accounting (``{"123_4": "COMPLETED"}``); empty where accounting is off."""
    ids = sorted({str(j).split("_")[0] for j in job_ids if j})
    if not ids or shutil.which("sacct") is None:
        return {}
    try:
        proc = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,State"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    out: Dict[str, str] = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 2:
            out[parts[0]] = parts[1].split()[0]  # "CANCELLED by 0" -> CANCELLED
    return out


# ---------------------------------------------------------------- review commands (status, cancel)
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"})


def squeue_query(job_ids: Iterable[str]) -> Optional[Dict[str, Tuple[str, str]]]:
    """Like :func:`squeue_states`, but ``None`` when the queue could not be asked (no squeue, controller down).

    Slurm answers "Invalid job id" when a single id is no longer known (purged after ``MinJobAge``):
    that is an empty queue, not an error.
    """
    ids = sorted({str(j).split("_")[0] for j in job_ids if j})
    if not have_slurm():
        return None
    if not ids:
        return {}
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i|%T|%r"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return {} if "Invalid job id" in proc.stderr else None
    out: Dict[str, Tuple[str, str]] = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            for job_id in expand_array_ids(parts[0]):
                out[job_id] = (parts[1], parts[2])
    return out


def expand_array_ids(job_id: str) -> List[str]:
    """``"14_[1-3,7%2]"`` -> ``["14_1", "14_2", "14_3", "14_7"]``; anything else unchanged."""
    m = re.fullmatch(r"(\d+)_\[([^\]]+)\]", job_id)
    if not m:
        return [job_id]
    out = []
    for part in m.group(2).split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def scancel(job_ids: List[str]) -> Tuple[int, str]:
    """Cancel jobs or array tasks (``123``, ``123_4``); returns scancel's exit code and its stderr."""
    if not job_ids:
        return 0, ""
    if shutil.which("scancel") is None:
        return 127, "scancel: not found on PATH (run this on a Slurm login node)"
    try:
        proc = subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return proc.returncode, proc.stderr.strip()
