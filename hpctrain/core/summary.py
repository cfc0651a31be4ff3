"""metrics.json, a run's documented summary (``status``, ``step``, ``metrics``): its one writer and merge rule.

Several processes write it: rank 0's progress, the job wrapper, the batch script after ``srun``,
``hpctrain cancel``, a search worker. Each write is a read-modify-write under an exclusive lock on a
sidecar file (:attr:`RunPaths.metrics_lock`), then a temp-file-and-rename, so readers never see a part
and no writer's fields are lost. The merge (:func:`merge`, pure):

- ``status`` (and ``restarts``, ``error``, ``failed_rank``) comes from the run record, read under the
  lock; a caller cannot overrule it. A run without a record keeps the caller's ``status``, except that
  a final one is not replaced by a non-final one.
- ``step`` never goes backwards within an attempt (a new attempt resumes from its checkpoint and may).
- ``metrics`` merge key by key; ``lineage`` (a PBT trial's) entry by entry, by step; every other field is replaced.

No torch here.
"""

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from hpctrain.core import events
from hpctrain.core.atomic import locked, read_json, write_json_atomic
from hpctrain.core.paths import HPCTRAIN_DIR, METRICS, METRICS_LOCK
from hpctrain.core.state import FAILURES, FINAL, RunState, State

PathLike = Union[str, Path]
ATTEMPT = "attempt"  # the record's attempt the summary was last written in (RunState.attempt)


def read(run_dir: PathLike) -> Optional[Dict[str, Any]]:
    return read_json(os.path.join(run_dir, METRICS))  # RunPaths(run_dir).metrics, without pathlib's cost


def write(run_dir: PathLike, **fields: Any) -> Dict[str, Any]:
    """Merge ``fields`` (``step``, ``metrics``, ...) into metrics.json under its lock; the summary written."""
    metrics = os.path.join(run_dir, METRICS)  # RunPaths(run_dir).metrics and .metrics_lock, without pathlib's cost
    with locked(os.path.join(run_dir, HPCTRAIN_DIR, METRICS_LOCK)):
        summary = merge(read_json(metrics) or {}, fields, events.read(run_dir), time.time())
        write_json_atomic(metrics, summary)
    return summary


def merge(old: Dict[str, Any], fields: Dict[str, Any], rs: RunState, now: float) -> Dict[str, Any]:
    """The summary after a write of ``fields`` over ``old``, the record being ``rs`` (see the module doc)."""
    out = dict(old)
    attempt = list(rs.attempt) if rs.state is not None else None
    same_attempt = old.get(ATTEMPT) == attempt
    for key, value in fields.items():
        if key == "status":
            continue  # below
        if key == "metrics" and isinstance(value, dict) and isinstance(old.get("metrics"), dict):
            out["metrics"] = {**old["metrics"], **value}
        elif key == "lineage" and isinstance(value, list):
            out["lineage"] = merge_lineage(old.get("lineage"), value)
        elif key == "step" and same_attempt and _number(old.get("step")) and _number(value) and value < old["step"]:
            continue  # a late writer of an older step
        else:
            out[key] = value
    if rs.state is not None:
        out["status"] = rs.state.value
        out["restarts"] = rs.restarts
        if rs.state in FAILURES:
            out["error"], out["failed_rank"] = rs.error, rs.failed_rank
        elif rs.state in (State.RUNNING, State.COMPLETED):
            out.pop("failed_rank", None)
            out["error"] = None
    elif "status" in fields:
        given, had = State.parse(fields["status"]), State.parse(old.get("status"))
        if not (had in FINAL and given not in FINAL and same_attempt):
            out["status"] = given.value if given is not None else fields["status"]
    if attempt is not None or ATTEMPT in out:
        out[ATTEMPT] = attempt
    out["updated"] = now
    return out


def merge_lineage(old: Any, new: List[Any]) -> List[Dict[str, Any]]:
    """Entries ``{"step", "parent", "params"}`` by step; a newer one for a step replaces the older (a unit
    run again after its worker died)."""
    by_step: Dict[int, Dict[str, Any]] = {}
    for e in (old if isinstance(old, list) else []) + new:
        if isinstance(e, dict) and _number(e.get("step")):
            by_step[int(e["step"])] = e
    return [by_step[s] for s in sorted(by_step)]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numbers(value: Any) -> Dict[str, float]:
    """A task function's return value as metrics: a number -> ``{"value": x}``; a dict -> its numbers
    (nested ``metrics`` dicts included); anything else -> ``{}``."""
    if isinstance(value, bool):
        return {}
    if isinstance(value, (int, float)):
        return {"value": float(value)}
    try:  # numpy / torch scalars
        if hasattr(value, "item") and not hasattr(value, "keys"):
            return numbers(value.item())
    except (TypeError, ValueError):
        return {}
    if hasattr(value, "items"):
        out: Dict[str, float] = {}
        for k, v in value.items():
            if k == "metrics" and hasattr(v, "items"):
                out.update({str(kk): float(vv) for kk, vv in numbers(v).items()})
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                out[str(k)] = float(v)
        return out
    return {}
