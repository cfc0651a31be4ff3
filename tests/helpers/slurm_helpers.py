"""Waiting on the real test cluster: its queue and the runs' own files."""

import json
import subprocess
import time
from pathlib import Path
from typing import Callable, List


def queued(job_id: str) -> List[str]:
    """Lines of `squeue -r` for a job (array tasks one per line): empty once it has left the queue."""
    out = subprocess.run(["squeue", "-h", "-r", "-j", job_id.split("_")[0], "-o", "%i %T"],
                         capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def metrics(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


def record_kinds(run_dir: Path) -> List[str]:
    """The run record's transitions, in order (``["submitted", "started", ...]``)."""
    from hpctrain.core import events

    return [e.kind for e in events.events(run_dir)]


def run_dirs(sweep: Path) -> List[Path]:
    return sorted((p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: int(p.name.split("_")[0]))


def job_id(sweep: Path) -> str:
    manifest = json.loads((sweep / "sweep.json").read_text())
    return manifest["submissions"][-1]["job_ids"][0]


def cancel(job: str) -> None:
    subprocess.run(["scancel", job], capture_output=True)
