"""``hpctrain status``: one row per run, then the count per state; ``--watch`` until every run has ended.

Login-node code: rich and the run files only (no torch, no matplotlib, no TensorBoard).
"""

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from rich.markup import escape

from hpctrain.core.state import FAILURES, State
from hpctrain.review import cost as costs
from hpctrain.review import fmt
from hpctrain.review.runs import STATES, Snapshot, collect
from hpctrain.review.sweep import load_sweep
from hpctrain.slurm import query as slurm

MAX_NOTES = 20  # lines about failed or cancelled runs under the table


def print_table(snap: Snapshot, con: Any, cost_of: Optional[Dict[int, costs.Cost]] = None) -> None:
    fancy = fmt.unicode_ok(con)
    objective = snap.objective()
    metric = str(objective["metric"]) if objective and objective.get("metric") != "train/loss" else None
    headers = ["trial" if snap.sweep.search is not None else "#", ", ".join(snap.sweep.swept) or "overrides", "state", "progress", "loss"]
    headers += [f"{metric} ({objective.get('mode', 'min')})"] if metric else []
    staged = any(r.stage for r in snap.runs)  # a search scheduler's trials: the rung each is at or runs to
    headers += ["elapsed", "restarts", "GPU-h", "log"]
    if staged:
        headers.insert(3, "unit")
    rows, styles = [], []
    for r in snap.runs:
        row = [str(r.idx), fmt.label(r.values, r.overrides), r.state, fmt.bar(r.step, r.max_steps, fancy=fancy),
               fmt.number(r.loss)]
        if staged:
            row.insert(3, r.stage or "")
        row += [fmt.number(r.metrics.get(metric))] if metric else []
        rows.append(row + [fmt.duration(r.elapsed_s), str(r.restarts), costs.shown((cost_of or {}).get(r.idx)),
                           fmt.short_path(r.log)])
        styles.append([None, None, fmt.STATE_STYLE.get(r.state)] + [None] * (len(headers) - 3))
    n = len(headers)
    shift = 1 if staged else 0
    fmt.table(con, headers, rows, right=(0, 4 + shift, n - 4, n - 3, n - 2) + ((5 + shift,) if metric else ()),
              styles=styles)


def counts_line(snap: Snapshot) -> str:
    counts = snap.counts()
    parts = [f"[{fmt.STATE_STYLE[s]}]{counts[s]} {s}[/]" for s in STATES if s in counts]
    return f"{fmt.runs(len(snap.runs))}: " + ", ".join(parts)


def render(snap: Snapshot, con: Any, cost_of: Optional[Dict[int, costs.Cost]] = None,
           cost_problems: Sequence[str] = ()) -> None:
    sweep = snap.sweep
    con.print(f"[bold]sweep[/] {escape(str(sweep.dir))}  ({sweep.launcher}, {fmt.runs(len(sweep.runs))}"
              f"{', no manifest yet' if not sweep.has_manifest else ''})", soft_wrap=True)
    print_table(snap, con, cost_of)
    notes = []
    for r in snap.runs:
        if r.state in FAILURES and r.error:
            notes.append(f"  [red]#{r.idx} {r.state}:[/] {escape(r.error.strip().splitlines()[-1])}")
        elif r.note and r.state not in (State.QUEUED, State.RUNNING, State.COMPLETED):
            notes.append(f"  [dim]#{r.idx} {r.state}: {escape(r.note)}[/]")
    for line in notes[:MAX_NOTES]:
        con.print(line, soft_wrap=True)
    if len(notes) > MAX_NOTES:
        con.print(f"  [dim]... and {len(notes) - MAX_NOTES} more (errors of all failed runs: "
                  f"python -m hpctrain report)[/]", soft_wrap=True)
    for line in costs.low_utilisation(snap.runs):
        con.print(f"  [yellow]{escape(line)}[/]", soft_wrap=True)
    for w in [*snap.warnings, *cost_problems]:
        con.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    total = costs.total_line(snap.runs, cost_of or {})
    if total:
        con.print(escape(total), soft_wrap=True)
    con.print(counts_line(snap), soft_wrap=True)


def exit_code(snap: Snapshot) -> int:
    return 1 if any(r.state in FAILURES for r in snap.runs) else 0


def run(sweep_dir: Path, watch: bool = False, interval_s: float = 10.0, as_json: bool = False) -> int:
    con = fmt.console()
    poller = None
    while True:
        sweep = load_sweep(sweep_dir)
        if watch and poller is None:  # rides out a busy slurmctld: a failed call is unknown, not gone
            poller = slurm.Poller(lambda: slurm.squeue([r.job_id for r in sweep.runs]), "squeue")
        snap = collect(sweep, poller)
        cost_of, cost_problems = costs.for_rows(sweep.dir, sweep.launcher, snap.runs)
        if as_json:
            runs = [{**r.to_dict(), "gpu_hours": c.gpu_hours if c else None, "cost": asdict(c) if c else None}
                    for r, c in ((r, cost_of.get(r.idx)) for r in snap.runs)]
            print(json.dumps({"sweep_dir": str(sweep_dir), "counts": snap.counts(),
                              "warnings": snap.warnings + cost_problems, "runs": runs,
                              "gpu_hours": sum(c.gpu_hours for c in cost_of.values())}, indent=1, default=str))
        else:
            if watch and con.is_terminal:
                con.clear()
            if watch:
                con.print(f"[dim]{time.strftime('%H:%M:%S')}  refreshing every {interval_s:g}s until all runs "
                          f"have ended (Ctrl-C to stop)[/]")
            render(snap, con, cost_of, cost_problems)
        if not watch or not snap.active():
            return exit_code(snap)
        time.sleep(interval_s)


def active_runs(sweep_dir: Path) -> List[int]:
    return [r.idx for r in collect(load_sweep(sweep_dir)).active()]
