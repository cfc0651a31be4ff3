"""What the ``hpctrain`` tab shows, as JSON: every run's row, the queue, failed runs' errors and log tails,
a search's trials. Re-read from the sweep's files on each call; never raises (what it could not read is
said in ``problems``).
"""

import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpctrain.core import paths as runfiles
from hpctrain.core.atomic import read_json
from hpctrain.core.state import State
from hpctrain.review import fmt, jobs
from hpctrain.review import reader
from hpctrain.review.sweep import SweepError, load_sweep

ACTIVE_WAITING = (State.QUEUED.value, State.REQUEUED.value, State.RETRYING.value)
FAILURES = (State.FAILED.value, State.TIMEOUT.value, State.HUNG.value)
LOG_TAIL_LINES = 20
MAX_LOG_TAILS = 200  # failed runs whose log tail is sent; the rest keep their error line
MAX_QUEUE_ROWS = 500


def read_sweep(sweep_dir: Path) -> Tuple[Optional[reader.Sweep], List[str]]:
    """The sweep through the Python API (``hpctrain.reader.read``), or None and why it could not be read."""
    if not os.path.isdir(sweep_dir):
        return None, [f"{sweep_dir}: no such directory (expected a sweep dir)"]
    try:
        return reader.read(load_sweep(sweep_dir)), []
    except SweepError as exc:
        return None, [str(exc)]
    except OSError as exc:
        return None, [f"{sweep_dir}: cannot be read ({exc.strerror or exc})"]


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


def _latest(run_dir: Any, metric: str) -> Tuple[Any, Optional[int]]:
    """A running run's newest value of the objective in its TensorBoard events (metrics.json has its final
    value only), and the step it was logged at."""
    from hpctrain.review.plots import read_scalars

    points = read_scalars(run_dir, [metric]).get(metric) or []
    return (number(points[-1][1]), points[-1][0]) if points else (None, None)


def _parent(run_dir: Any) -> Optional[int]:
    """A PBT trial's newest parent (the trial whose weights it took at its last exploit), from its lineage."""
    found = (read_json(os.path.join(run_dir, runfiles.METRICS)) or {}).get("lineage") if run_dir else None
    parents = [e.get("parent") for e in found if isinstance(e, dict)] if isinstance(found, list) else []
    parents = [p for p in parents if isinstance(p, int)]
    return parents[-1] if parents else None


def _torn_metrics(run_dir: Any) -> bool:
    if not run_dir:
        return False
    path = os.path.join(run_dir, runfiles.METRICS)
    return os.path.exists(path) and read_json(path) is None


def payload(sweep_dir: Path, tails: TailCache) -> Dict[str, Any]:
    sweep, problems = read_sweep(sweep_dir)
    runs = sweep.runs if sweep is not None else []
    local = sweep is not None and sweep.launcher == "local"
    rows: List[Dict[str, Any]] = []
    queue: List[Dict[str, Any]] = []
    failed: List[Dict[str, Any]] = []
    for r in runs:
        row = {
            "idx": r.idx, "label": fmt.label(r.values, r.overrides), "state": r.state, "note": r.note,
            "step": r.step, "max_steps": r.max_steps, "objective": number(r.objective),
            "restarts": r.restarts, "elapsed": fmt.duration(r.elapsed_s), "job_id": r.job_id,
            "gpu_hours": number(r.cost.gpu_hours if r.cost else None), "estimated": bool(r.cost and r.cost.estimated),
            "redone_gpu_hours": number(r.cost.redone_gpu_hours) if r.cost and r.cost.requeues else None,
            "gpu_util": number(r.utilisation.get("gpu_util_mean")),
            "stage": r.stage, "parent": _parent(r.run_dir), "log": r.log, "objective_step": None,
            "straggler": r.straggler, "stragglers": r.stragglers,
        }
        if r.objective is None and r.state is State.RUNNING and sweep is not None and sweep.objective_metric:
            row["objective"], row["objective_step"] = _latest(r.run_dir, sweep.objective_metric)
        rows.append(row)
        if r.state in ACTIVE_WAITING and len(queue) < MAX_QUEUE_ROWS:
            queue.append({"idx": r.idx, "label": row["label"], "state": r.state, "job_id": r.job_id,
                          "reason": r.note or ("waiting for a free slot" if local else "")})
        if r.state in FAILURES:
            failed.append({"idx": r.idx, "label": row["label"], "state": r.state, "error": r.error or r.note or "",
                           "log": r.log, "tail": tails.tail(r.log) if len(failed) < MAX_LOG_TAILS else []})
        if r.step is None and _torn_metrics(r.run_dir):
            problems.append(f"#{r.idx}: {os.path.join(str(r.run_dir), runfiles.METRICS)} could not be read "
                            f"(torn or half written): its row shows what the run record says")
    counts: Dict[str, int] = {s.value: n for s, n in sweep.counts().items()} if sweep is not None else {}
    objective = ({"metric": sweep.objective_metric, "mode": sweep.direction.value}
                 if sweep is not None and sweep.objective_metric else None)
    out: Dict[str, Any] = {
        "sweep_dir": str(sweep_dir), "launcher": sweep.launcher if sweep else None,
        "swept": list(sweep.swept) if sweep else [], "objective": objective, "counts": counts,
        "runs": rows, "queue": queue, "queue_total": sum(1 for row in rows if row["state"] in ACTIVE_WAITING),
        "failed": failed, "stragglers": [{"idx": r.idx, "label": fmt.label(r.values, r.overrides), "state": r.state,
                                          "line": r.straggler, "ranks": r.stragglers} for r in runs if r.stragglers],
        "warnings": list(sweep.problems) if sweep else [], "problems": problems, "search": None,
        "cost": cost_summary(sweep) if sweep is not None else None,
    }
    search = sweep.listing.search if sweep is not None and sweep.listing is not None else None
    if search is not None and sweep is not None:
        out["search"] = {"metric": sweep.objective_metric, "mode": sweep.direction.value,
                         "history": [[row["idx"], row["objective"], row["state"]] for row in rows
                                     if isinstance(row["objective"], (int, float))]}
    return out


def cost_summary(sweep: reader.Sweep) -> Dict[str, Any]:
    """The sweep's cost as the tab shows it: total GPU-hours, by state, and the report's line."""
    from hpctrain.review import cost as costs

    return {"gpu_hours": number(sweep.gpu_hours()),
            "by_state": {s.value: number(h) for s, h in sweep.cost_by_state().items()},
            "redone_gpu_hours": number(sweep.redone_gpu_hours()),
            "line": costs.total_line(sweep.runs), "redone": costs.redone_line(sweep.runs)}
