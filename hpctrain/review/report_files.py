"""The report's files in the sweep dir: results.csv, results.json, report.md (each written temp + rename)."""

import csv
import io
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpctrain import runfiles
from hpctrain.review import fmt
from hpctrain.review.ranking import Ranking


def _typed(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _error_tail(error: Optional[str], n: int = 8) -> str:
    lines = [line for line in (error or "").splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rows(ranking: Ranking, swept: List[str]) -> List[Dict[str, Any]]:
    """One flat row per run, best first: what the CSV holds (the JSON holds the same, nested)."""
    metric_keys = sorted({k for x in ranking.runs for k, v in x.record.metrics.items() if isinstance(v, (int, float))})
    out = []
    for x in ranking.runs:
        r = x.record
        row: Dict[str, Any] = {"rank": x.rank, "idx": r.idx, "name": r.name, "state": r.state,
                               "best": ranking.best is x, ranking.metric: x.value}
        row.update({k: _typed(r.values[k]) if k in r.values else None for k in swept})
        row.update({k: r.metrics.get(k) for k in metric_keys if k != ranking.metric})
        row.update(step=r.step, max_steps=r.max_steps, elapsed_s=r.elapsed_s, restarts=r.restarts, job_id=r.job_id,
                   run_dir=r.run_dir, log=r.log, overrides=" ".join(r.overrides),
                   error=(_error_tail(r.error, 1) or None))
        out.append(row)
    return out


def write_csv(path: Path, table: List[Dict[str, Any]]) -> None:
    buf = io.StringIO()
    if table:
        writer = csv.DictWriter(buf, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in table)
    write_text_atomic(path, buf.getvalue())


def write_json(path: Path, ranking: Ranking, sweep_dir: Path, counts: Dict[str, int], command: Optional[str],
               plots: List[Path]) -> None:
    best = ranking.best
    runfiles.write_json_atomic(path, {
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
                  "params": {k: _typed(v) for k, v in x.record.values.items()}} for x in ranking.runs],
    })


def markdown(ranking: Ranking, sweep_dir: Path, swept: List[str], counts: Dict[str, int], command: Optional[str],
             plots: List[Path]) -> str:
    m = ranking.metric
    lines = [f"# Sweep report: `{sweep_dir}`", "",
             f"{fmt.runs(sum(counts.values()))}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".  ",
             f"Ranked by the final `{m}` ({'lower' if ranking.mode == 'min' else 'higher'} is better).", ""]
    best = ranking.best
    if best is not None:
        label = " ".join(f"{k}={v}" for k, v in best.record.values.items()) or "(defaults)"
        lines += ["## Best run", "", f"**#{best.record.idx} {label}**: `{m}` = {fmt.number(best.value)} "
                  f"({best.record.state}){'  ' + ranking.best_note if ranking.best_note else ''}", "",
                  "Reproduce it:", "", "```bash", command or "", "```", ""]
    head = ["rank", "#"] + swept + ["state", m, "train/loss" if m != "train/loss" else "val/loss", "step",
                                    "elapsed", "restarts", "run dir"]
    lines += ["## All runs", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    other = head[len(swept) + 4]
    for x in ranking.runs:
        r = x.record
        cells = [str(x.rank or "-"), str(r.idx)] + [r.values.get(k, "") for k in swept] + [
            f"**{r.state}**" if x is best else r.state, fmt.number(x.value), fmt.number(r.metrics.get(other)),
            fmt.bar(r.step, r.max_steps, width=0).split(" ")[0], fmt.duration(r.elapsed_s), str(r.restarts),
            f"`{os.path.relpath(r.run_dir, sweep_dir)}`" if r.run_dir else "-"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    failed = [x.record for x in ranking.runs if x.record.state in ("failed", "timeout")]
    if failed:
        lines += ["", "## Failed runs", ""]
        for r in failed:
            label = " ".join(f"{k}={v}" for k, v in r.values.items())
            lines += [f"### #{r.idx} {label} ({r.state})", "", f"log: `{r.log or '-'}`", "", "```",
                      _error_tail(r.error) or r.note or "(no error recorded)", "```", ""]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"
