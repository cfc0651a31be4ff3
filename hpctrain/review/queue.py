"""What Slurm says about a sweep's jobs: squeue first (always there), sacct when accounting exists."""

import shutil
import subprocess
from typing import Dict, Iterable, Tuple


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
