"""What the ``hpctrain`` tab shows, as JSON: every run's row, the queue, failed runs' errors and log tails,
a search's trials. Re-read from the sweep's files on each call; never raises (what it could not read is
said in ``problems``).
"""

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpctrain.core import paths as runfiles
from hpctrain.core.events import State
from hpctrain.review import fmt, jobs
from hpctrain.review.runs import collect
from hpctrain.review.sweep import SweepError, load_sweep

ACTIVE_WAITING = (State.QUEUED.value, State.REQUEUED.value, State.RETRYING.value)
FAILURES = (State.FAILED.value, State.TIMEOUT.value)
LOG_TAIL_LINES = 20
MAX_LOG_TAILS = 200  # failed runs whose log tail is sent; the rest keep their error line
MAX_QUEUE_ROWS = 500


@dataclass
class SweepRead:
    """What one read of a sweep gave: its runs (review rows), settings, and what could not be read."""
    sweep: Any = None
    runs: List[Any] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def read_sweep(sweep_dir: Path) -> SweepRead:
    """The one call into hpctrain's review layer (to be switched to ``hpctrain.load(dir).runs``)."""
    if not os.path.isdir(sweep_dir):
        return SweepRead(problems=[f"{sweep_dir}: no such directory (expected a sweep dir)"])
    try:
        snap = collect(load_sweep(sweep_dir))
    except SweepError as exc:
        return SweepRead(problems=[str(exc)])
    except OSError as exc:
        return SweepRead(problems=[f"{sweep_dir}: cannot be read ({exc.strerror or exc})"])
    return SweepRead(sweep=snap.sweep, runs=snap.runs, warnings=list(snap.warnings))


class TailCache:
    """Log tails, re-read only when the log file changed (size or mtime)."""

    def __init__(self) -> None:
        self._seen: Dict[str, Tuple[Tuple[int, int], List[str]]] = {}

    def tail(self, path: Optional[str]) -> List[str]:
        if not path:
            return []
        try:
            st = os.stat(path)
        except OSError:
            return []
        key = (st.st_size, st.st_mtime_ns)
        hit = self._seen.get(path)
        if hit is None or hit[0] != key:
            hit = (key, jobs.tail_lines(path, LOG_TAIL_LINES))
            self._seen[path] = hit
        return hit[1]


def number(value: Any) -> Any:
    """A JSON-safe number: NaN and infinities as their names (JSON has none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else str(value)


def _optional(row: Any, name: str, metric: str) -> Any:
    """A column another part of hpctrain may add to the row, else the run's metric of that name."""
    value = getattr(row, name, None)
    return number(value if value is not None else row.metrics.get(metric))


def _torn_metrics(run_dir: Optional[str]) -> bool:
    path = os.path.join(run_dir, runfiles.METRICS) if run_dir else None
    return bool(path) and os.path.exists(path) and runfiles.read_json(path) is None


def payload(sweep_dir: Path, tails: TailCache) -> Dict[str, Any]:
    read = read_sweep(sweep_dir)
    problems = list(read.problems)
    sweep = read.sweep
    rows, queue, failed = [], [], []
    objective: Optional[Dict[str, str]] = None
    for r in read.runs:
        objective = objective or r.objective
        row = {
            "idx": r.idx, "label": fmt.label(r.values, r.overrides), "state": r.state, "note": r.note,
            "step": r.step, "max_steps": r.max_steps, "objective": number(r.objective_value),
            "restarts": r.restarts, "elapsed": fmt.duration(r.elapsed_s), "job_id": r.job_id,
            "gpu_hours": _optional(r, "gpu_hours", "cost/gpu_hours"),
            "gpu_util": _optional(r, "gpu_util", "sys/gpu_util"),
        }
        rows.append(row)
        if r.state in ACTIVE_WAITING and len(queue) < MAX_QUEUE_ROWS:
            queue.append({"idx": r.idx, "label": row["label"], "state": r.state, "job_id": r.job_id,
                          "reason": r.note or ("waiting for a free slot" if sweep.launcher == "local" else "")})
        if r.state in FAILURES:
            failed.append({"idx": r.idx, "label": row["label"], "state": r.state, "error": r.error or r.note or "",
                           "log": r.log, "tail": tails.tail(r.log) if len(failed) < MAX_LOG_TAILS else []})
        if r.step is None and _torn_metrics(r.run_dir):
            problems.append(f"#{r.idx}: {os.path.join(r.run_dir, runfiles.METRICS)} could not be read "
                            f"(torn or half written): its row shows what the run record says")
    counts: Dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    out: Dict[str, Any] = {
        "sweep_dir": str(sweep_dir), "launcher": sweep.launcher if sweep else None,
        "swept": list(sweep.swept) if sweep else [], "objective": objective, "counts": counts,
        "runs": rows, "queue": queue, "queue_total": sum(1 for row in rows if row["state"] in ACTIVE_WAITING),
        "failed": failed, "warnings": read.warnings, "problems": problems, "search": None,
    }
    if sweep is not None and sweep.search is not None:
        mode = "max" if sweep.search.get("direction") == "maximize" else "min"
        out["search"] = {"metric": sweep.objective_metric, "mode": mode,
                         "history": [[row["idx"], row["objective"], row["state"]] for row in rows
                                     if isinstance(row["objective"], (int, float))]}
    return out
