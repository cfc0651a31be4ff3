"""Rank a sweep's runs by one metric and name the best; the command that reproduces a run; the report's
files in the sweep dir (results.csv, results.json, report.md, each written temp + rename).
"""

import csv
import io
import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from hpctrain.core import safefs
from hpctrain.core.paths import RunPaths
from hpctrain.core.redact import redact_overrides, secret_hint
from hpctrain.core.state import FAILURES, Direction, State
from hpctrain.review import fmt
from hpctrain.review import hardware as ran_on
from hpctrain.review.runs import Run, fallback_metric
from hpctrain.review.sweep import typed_value  # noqa: F401 - importable from here too

_HIGHER_IS_BETTER = re.compile(r"acc|f1|auc|score|mfu|per_s|throughput|reward|bleu|precision|recall", re.I)


@dataclass
class Ranked:
    record: Run
    value: Optional[float]  # the metric's final value; None when the run has none (yet)
    rank: Optional[int] = None


@dataclass
class Ranking:
    metric: str
    mode: Direction
    runs: List[Ranked]  # best first; runs without a value last, by index
    best: Optional[Ranked]
    best_note: str = ""  # set when the best run is not a completed one


def objective(records: List[Run]) -> Optional[Dict[str, str]]:
    """The objective the runs declare in their metrics.json (``{"metric": ..., "mode": ...}``), if any."""
    return next((r.declared_objective for r in records if r.declared_objective), None)


def default_metric(records: List[Run], last_values: Dict[int, Dict[str, float]]) -> str:
    """The runs' declared objective; else the final validation loss if any run has one, else the training loss."""
    declared = objective(records)
    if declared:
        return str(declared["metric"])
    logged = [{**r.metrics, **{k: v for k, v in last_values.get(r.idx, {}).items() if k in ("val/loss", "train/loss")}}
              for r in records]  # TensorBoard's last values count for the losses, a returned metric for the rest
    return fallback_metric(logged) or "train/loss"


def default_mode(metric: str, records: Optional[List[Run]] = None) -> Direction:
    """The declared objective's mode for its metric; else guessed from the name (accuracy up, loss down)."""
    declared = objective(records or [])
    if declared and declared.get("metric") == metric:
        try:
            return Direction.parse(declared.get("mode"))
        except ValueError:
            pass  # an unreadable mode: guessed as if none was declared
    return Direction.MAX if _HIGHER_IS_BETTER.search(metric) else Direction.MIN


def available_metrics(records: List[Run], last_values: Dict[int, Dict[str, float]]) -> List[str]:
    names: Set[str] = set()
    for r in records:
        names.update(k for k, v in r.metrics.items() if isinstance(v, (int, float)))
        names.update(last_values.get(r.idx, {}))
    return sorted(names)


def rank(records: List[Run], metric: str, mode: "Direction | str",
         last_values: Dict[int, Dict[str, float]]) -> Ranking:
    """``last_values``: the last TensorBoard value per run and tag, for metrics metrics.json does not hold."""
    mode = Direction.parse(mode)
    ranked = []
    for r in records:
        value = r.metrics.get(metric, last_values.get(r.idx, {}).get(metric))
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ranked.append(Ranked(r, float(value) if ok and value is not None else None))
    with_value = sorted((x for x in ranked if x.value is not None),
                        key=lambda x: (mode.sign * (x.value or 0.0), x.record.idx))  # with a value: never None
    for n, x in enumerate(with_value, 1):
        x.rank = n
    rest = [x for x in ranked if x.value is None]
    completed = [x for x in with_value if x.record.state is State.COMPLETED]
    best, note = (completed[0], "") if completed else (with_value[0] if with_value else None, "")
    if best is not None and best.record.state is not State.COMPLETED:
        note = f"no run has completed: the best so far ({best.record.state})"
    return Ranking(metric=metric, mode=mode, runs=with_value + rest, best=best, best_note=note)


def reproduce_command(record: Run, app: Optional[str] = None) -> str:
    """The command line that trains this run again, as one run, from the directory the sweep was started in."""
    if app and app.endswith(".py"):  # a script
        program = ["python", shlex.quote(app)]
    else:
        program = ["python", "-m", "hpctrain" if not app or app.startswith("hpctrain") else app]
    overrides = redact_overrides(record.overrides)
    cmd = " ".join(program + [shlex.quote(o) for o in overrides])
    hint = secret_hint(overrides)
    cwd = _launch_cwd(record.run_dir)
    cmd = f"cd {shlex.quote(cwd)} && {cmd}" if cwd and cwd != str(Path.cwd()) else cmd
    return f"{cmd}  {hint}" if hint else cmd


def _launch_cwd(run_dir: "Optional[str | Path]") -> Optional[str]:
    if not run_dir:
        return None
    path = RunPaths(run_dir).hydra_yaml
    try:
        import yaml

        with open(safefs.open_read(path)) as f:  # a planted link is not followed
            cfg = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return str(cfg["hydra"]["runtime"]["cwd"])
    except (OSError, KeyError, TypeError, ValueError, ImportError):
        return None
    except Exception:  # noqa: BLE001 - a yaml error: no cwd, the command alone
        return None


def _error_tail(error: Optional[str], n: int = 8) -> str:
    lines = [line for line in (error or "").splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def result_rows(ranking: Ranking, swept: List[str]) -> List[Dict[str, Any]]:
    """One flat row per run, best first: what the CSV holds (the JSON holds the same, nested)."""
    metric_keys = sorted({k for x in ranking.runs for k, v in x.record.metrics.items() if isinstance(v, (int, float))})
    out = []
    for x in ranking.runs:
        r = x.record
        row: Dict[str, Any] = {"rank": x.rank, "idx": r.idx, "name": r.name, "state": r.state,
                               "best": ranking.best is x, ranking.metric: x.value}
        row.update({k: typed_value(r.values[k]) if k in r.values else None for k in swept})
        row.update({k: r.metrics.get(k) for k in metric_keys if k != ranking.metric})
        row.update(step=r.step, max_steps=r.max_steps, elapsed_s=r.elapsed_s, restarts=r.restarts, job_id=r.job_id,
                   run_dir=r.run_dir, log=r.log, overrides=" ".join(r.overrides),
                   error=(_error_tail(r.error, 1) or None))
        hw = r.hardware  # what its latest attempt ran on
        row.update(gpu_model=hw.get("gpu_model"), cpu_model=hw.get("cpu_model"),
                   nodes=",".join(ran_on.nodes(hw)) or None)
        out.append(row)
    return out


def csv_text(table: List[Dict[str, Any]]) -> str:
    buf = io.StringIO()
    if table:
        writer = csv.DictWriter(buf, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in table)
    return buf.getvalue()


def json_data(ranking: Ranking, sweep_dir: Path, counts: Dict[State, int], command: Optional[str],
              plots: List[Path]) -> Dict[str, Any]:
    """What results.json holds."""
    best = ranking.best
    return {
        "sweep_dir": str(sweep_dir),
        "metric": ranking.metric,
        "mode": ranking.mode,
        "counts": counts,
        "best": None if best is None else {"idx": best.record.idx, "name": best.record.name,
                                           "values": best.record.values, "value": best.value,
                                           "state": best.record.state, "command": command,
                                           "note": ranking.best_note or None},
        "plots": [p.name for p in plots],
        "runs": [{**x.record.to_dict(), "rank": x.rank, "value": x.value,
                  "params": {k: typed_value(v) for k, v in x.record.values.items()}} for x in ranking.runs],
    }


def markdown(ranking: Ranking, sweep_dir: Path, swept: List[str], counts: Dict[State, int], command: Optional[str],
             plots: List[Path]) -> str:
    m = ranking.metric
    lines = [f"# Sweep report: `{sweep_dir}`", "",
             f"{fmt.runs(sum(counts.values()))}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".  ",
             f"Ranked by the final `{m}` ({'lower' if ranking.mode is Direction.MIN else 'higher'} is better).", ""]
    best = ranking.best
    if best is not None:
        label = fmt.label(best.record.values, best.record.overrides)
        lines += ["## Best run", "", f"**#{best.record.idx} {label}**: `{m}` = {fmt.number(best.value)} "
                  f"({best.record.state}){'  ' + ranking.best_note if ranking.best_note else ''}", "",
                  "Reproduce it:", "", "```bash", command or "", "```", ""]
    head = ["rank", "#"] + swept + ["state", m, "train/loss" if m != "train/loss" else "val/loss", "step",
                                    "elapsed", "restarts", "run dir"]
    lines += ["## All runs", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    other = head[len(swept) + 4]
    for x in ranking.runs:
        r = x.record
        cells = [str(x.rank or "-"), str(r.idx)] + [fmt.value(r.values.get(k, "")) for k in swept] + [
            f"**{r.state}**" if x is best else r.state, fmt.number(x.value), fmt.number(r.metrics.get(other)),
            fmt.bar(r.step, r.max_steps, width=0).split(" ")[0], fmt.duration(r.elapsed_s), str(r.restarts),
            f"`{os.path.relpath(r.run_dir, sweep_dir)}`" if r.run_dir else "-"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    failed = [x.record for x in ranking.runs if x.record.state in FAILURES]
    if failed:
        lines += ["", "## Failed runs", ""]
        for r in failed:
            label = fmt.label(r.values, r.overrides)
            lines += [f"### #{r.idx} {label} ({r.state})", "", f"log: `{r.log or '-'}`", "", "```",
                      _error_tail(r.error) or r.note or "(no error recorded)", "```", ""]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"
