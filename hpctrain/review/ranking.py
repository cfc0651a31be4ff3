"""Rank a sweep's runs by one metric and name the best; the command that reproduces a run."""

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from hpctrain import runfiles
from hpctrain.review.runs import RunRecord

_HIGHER_IS_BETTER = re.compile(r"acc|f1|auc|score|mfu|per_s|throughput|reward|bleu|precision|recall", re.I)


@dataclass
class Ranked:
    record: RunRecord
    value: Optional[float]  # the metric's final value; None when the run has none (yet)
    rank: Optional[int] = None


@dataclass
class Ranking:
    metric: str
    mode: str  # "min" | "max"
    runs: List[Ranked]  # best first; runs without a value last, by index
    best: Optional[Ranked]
    best_note: str = ""  # set when the best run is not a completed one


def default_metric(records: List[RunRecord], last_values: Dict[int, Dict[str, float]]) -> str:
    """The final validation loss if any run has one, else the final training loss."""
    have = any("val/loss" in r.metrics or "val/loss" in last_values.get(r.idx, {}) for r in records)
    return "val/loss" if have else "train/loss"


def default_mode(metric: str) -> str:
    return "max" if _HIGHER_IS_BETTER.search(metric) else "min"


def available_metrics(records: List[RunRecord], last_values: Dict[int, Dict[str, float]]) -> List[str]:
    names = set()
    for r in records:
        names.update(k for k, v in r.metrics.items() if isinstance(v, (int, float)))
        names.update(last_values.get(r.idx, {}))
    return sorted(names)


def rank(records: List[RunRecord], metric: str, mode: str, last_values: Dict[int, Dict[str, float]]) -> Ranking:
    """``last_values``: the last TensorBoard value per run and tag, for metrics metrics.json does not hold."""
    ranked = []
    for r in records:
        value = r.metrics.get(metric, last_values.get(r.idx, {}).get(metric))
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ranked.append(Ranked(r, float(value) if ok else None))
    sign = 1.0 if mode == "min" else -1.0
    with_value = sorted((x for x in ranked if x.value is not None), key=lambda x: (sign * x.value, x.record.idx))
    for n, x in enumerate(with_value, 1):
        x.rank = n
    rest = [x for x in ranked if x.value is None]
    completed = [x for x in with_value if x.record.state == "completed"]
    best, note = (completed[0], "") if completed else (with_value[0] if with_value else None, "")
    if best is not None and best.record.state != "completed":
        note = f"no run has completed: the best so far ({best.record.state})"
    return Ranking(metric=metric, mode=mode, runs=with_value + rest, best=best, best_note=note)


def reproduce_command(record: RunRecord, app: Optional[str] = None) -> str:
    """The command line that trains this run again, as one run, from the directory the sweep was started in."""
    module = "hpctrain" if not app or app.startswith("hpctrain") else app
    cmd = " ".join(["python", "-m", module] + [shlex.quote(o) for o in record.overrides])
    cwd = _launch_cwd(record.run_dir)
    return f"cd {shlex.quote(cwd)} && {cmd}" if cwd and cwd != str(Path.cwd()) else cmd


def _launch_cwd(run_dir: Optional[str]) -> Optional[str]:
    if not run_dir:
        return None
    path = Path(run_dir) / runfiles.HYDRA_DIR / "hydra.yaml"
    try:
        import yaml

        with open(path) as f:
            cfg = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return str(cfg["hydra"]["runtime"]["cwd"])
    except (OSError, KeyError, TypeError, ValueError, ImportError):
        return None
    except Exception:  # noqa: BLE001 - a yaml error: no cwd, the command alone
        return None
