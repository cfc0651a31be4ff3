"""A PBT search in ``report``: every trial's hyperparameters over steps (a PNG), and the best trial's
schedule (its own lineage back to its last exploit, its donors' before that) with a command that trains
it as one run (the trainer's ``schedule`` key).
"""

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpctrain.core import summary
from hpctrain.review import plots
from hpctrain.review.ranking import Ranking, reproduce_command
from hpctrain.search import pbt


def lineages(records: List[Any]) -> Dict[int, List[Dict[str, Any]]]:
    """Each trial's metrics.json ``lineage`` (runs without one left out)."""
    out = {}
    for r in records:
        found = (summary.read(r.run_dir) or {}).get("lineage") if r.run_dir else None
        if isinstance(found, list) and found:
            out[r.idx] = found
    return out


def replay_command(record: Any, sched: List[Dict[str, Any]], app: Optional[str]) -> str:
    """The best trial's reproduce command with its searched keys replaced by the schedule's overrides."""
    keys = {k for e in sched for k in e["params"]}
    kept = [o for o in record.overrides if o.split("=", 1)[0].lstrip("+~") not in keys | {"schedule"}]
    return reproduce_command(dataclasses.replace(record, overrides=kept + pbt.replay_overrides(sched)), app)


def section(ranking: Ranking, records: List[Any], app: Optional[str], sweep_dir: Path
            ) -> Tuple[List[str], Optional[str], List[Path]]:
    """(lines to print, the replay command, images) for a PBT search; nothing for other sweeps."""
    found = lineages(records)
    if not found or ranking.best is None or ranking.best.record.idx not in found:
        return [], None, []
    best = ranking.best.record
    sched = pbt.schedule(best.idx, found)
    lines = [f"schedule of #{best.idx} (its lineage, its donors' before each exploit):"]
    for e in sched:
        values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in e["params"].items())
        lines.append(f"  from step {e['step']}: {values}")
    exploits = [f"step {e['step']} from #{e['parent']}" for e in found[best.idx] if e.get("parent") is not None]
    lines.append(f"  exploits of #{best.idx}: {', '.join(exploits) or 'none'}")
    images: List[Path] = []
    max_steps = max((r.max_steps or 0) for r in records) or None
    series = {idx: [(int(e["step"]), dict(e["params"])) for e in entries] for idx, entries in found.items()}
    best_series = [(int(e["step"]), dict(e["params"])) for e in sched]
    images.append(plots.param_schedules(series, best.idx, best_series, max_steps, sweep_dir / "pbt_schedules.png"))
    return lines, replay_command(best, sched, app), images


def params_said(ranking: Ranking, records: List[Any]) -> str:
    """The best PBT trial's params as the launch summary says them (:func:`pbt.params_said`); "" otherwise."""
    found = lineages(records)
    if ranking.best is None or ranking.best.record.idx not in found:
        return ""
    return pbt.params_said(pbt.schedule(ranking.best.record.idx, found))
