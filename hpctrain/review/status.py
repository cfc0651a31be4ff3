"""``hpctrain status``: one row per run, then the count per state; ``--watch`` until every run has ended.

Login-node code: rich and the run files only (no torch, no matplotlib, no TensorBoard).
"""

import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Any, List, Optional

from rich.markup import escape

from hpctrain.review import reader
from hpctrain.core.state import FAILURES, State
from hpctrain.review import cost as costs
from hpctrain.review import fmt
from hpctrain.review.runs import state_counts
from hpctrain.review.sweep import load_sweep
from hpctrain.slurm import query as slurm

MAX_NOTES = 20  # lines about failed or cancelled runs under the table


def print_table(sweep: reader.Sweep, con: Any) -> None:
    fancy = fmt.unicode_ok(con)
    search = sweep.listing is not None and sweep.listing.search is not None
    # an app that logs no train/loss (any Hydra app): its own returned metric, first of them, in that column
    own = [] if any(r.loss is not None for r in sweep.runs) else list(dict.fromkeys(k for r in sweep.runs for k in r.metrics))
    shown = own[0] if own else None
    # the objective report ranks by, in a column of its own unless that one shows it already
    metric = sweep.objective_metric if sweep.objective_metric not in ("train/loss", shown) else None
    headers = ["trial" if search else "#", ", ".join(sweep.swept) or "overrides", "state", "progress", shown or "loss"]
    headers += [f"{metric} ({sweep.direction.value})"] if metric else []
    staged = any(r.stage for r in sweep.runs)  # a search scheduler's trials: the rung each is at or runs to
    headers += ["elapsed", "restarts", "GPU-h", "log"]
    if staged:
        headers.insert(3, "unit")
    rows: List[List[str]] = []
    styles: List[List[Optional[str]]] = []
    styled = con.is_terminal and not con.no_color  # piped, the table is plain lines: no style per cell to make
    here = os.getcwd() + os.sep
    for r in sweep.runs:
        waiting = r.state is State.QUEUED and r.note and r.step is None  # Slurm's pending reason, as the tab shows it
        progress = f"({r.note})" if waiting else fmt.bar(r.step, r.max_steps, fancy=fancy)
        row = [str(r.idx), fmt.label(r.values, r.overrides), r.state, progress,
               fmt.number(r.metrics.get(shown) if shown else r.loss)]
        if staged:
            row.insert(3, r.stage or "")
        row += [fmt.number(r.metrics.get(metric))] if metric else []
        rows.append(row + [fmt.duration(r.elapsed_s), str(r.restarts), costs.shown(r.cost),
                           fmt.short_path(r.log, here)])
        if styled:
            styles.append([None, None, fmt.STATE_STYLE.get(r.state)] + [None] * (len(headers) - 3))
    n = len(headers)
    shift = 1 if staged else 0
    fmt.table(con, headers, rows, right=(0, 4 + shift, n - 4, n - 3, n - 2) + ((5 + shift,) if metric else ()),
              styles=styles if styled else None, droppable=(n - 3, n - 2, n - 4, n - 1), squeeze=1)  # restarts, GPU-h, elapsed, log


def counts_line(sweep: Any) -> str:
    """``3 runs: 2 completed, 1 failed`` of a sweep's runs (an ``reader.Sweep``, or cancel's ``runs.Snapshot``)."""
    parts = [f"[{fmt.STATE_STYLE[s]}]{n} {s}[/]" for s, n in state_counts(sweep.runs).items()]
    return f"{fmt.runs(len(sweep.runs))}: " + ", ".join(parts)


def render(sweep: reader.Sweep, con: Any) -> None:
    manifest = sweep.listing is None or sweep.listing.has_manifest
    con.print(f"[bold]sweep[/] {escape(str(sweep.dir))}  ({sweep.launcher}, {fmt.runs(len(sweep.runs))}"
              f"{', no manifest yet' if not manifest else ''})", soft_wrap=True)
    print_table(sweep, con)
    notes = []
    for r in sweep.runs:
        if r.state in FAILURES and r.error:
            notes.append(f"  [red]#{r.idx} {r.state}:[/] {escape(r.error.strip().splitlines()[-1])}")
        elif r.note and r.state not in (State.QUEUED, State.RUNNING, State.COMPLETED):
            notes.append(f"  [dim]#{r.idx} {r.state}: {escape(r.note)}[/]")
        if r.stragglers:
            notes.append(f"  [yellow]#{r.idx} {escape(r.straggler)}[/]")
    for line in notes[:MAX_NOTES]:
        con.print(line, soft_wrap=True)
    if len(notes) > MAX_NOTES:
        con.print(f"  [dim]... and {len(notes) - MAX_NOTES} more (errors of all failed runs: "
                  f"python -m hpctrain report)[/]", soft_wrap=True)
    for line in costs.low_utilisation(sweep.runs):
        con.print(f"  [yellow]{escape(line)}[/]", soft_wrap=True)
    for w in sweep.problems:
        con.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    if sweep.dead_workers:  # nothing else would say so: the search has no trial to show
        n = len(sweep.dead_workers)
        con.print(f"[red]the search's {n} worker{'s' if n != 1 else ''} died before running a trial:[/]",
                  soft_wrap=True)
        for line in sweep.dead_workers:
            con.print(f"  [red]{escape(line)}[/]", soft_wrap=True)
    total = costs.total_line(sweep.runs)
    if total:
        con.print(escape(total), soft_wrap=True)
    con.print(counts_line(sweep), soft_wrap=True)


def exit_code(sweep: reader.Sweep) -> int:
    return 1 if sweep.dead_workers or any(r.state in FAILURES for r in sweep.runs) else 0


def run(sweep_dir: Path, watch: bool = False, interval_s: float = 10.0, as_json: bool = False) -> int:
    con = fmt.console()
    poller = None
    while True:
        with reader.quiet_gc():
            listing = load_sweep(sweep_dir)
            if watch and poller is None:  # rides out a busy slurmctld: a failed call is unknown, not gone
                poller = slurm.Poller(partial(slurm.squeue, [*(r.job_id for r in listing.runs),
                                                            *listing.worker_job_ids]), "squeue")
            sweep = reader.read(listing, poller)
        if as_json:
            runs = [{**r.to_dict(), "gpu_hours": r.cost.gpu_hours if r.cost else None} for r in sweep.runs]
            print(json.dumps({"sweep_dir": str(sweep_dir), "counts": sweep.counts(), "warnings": sweep.problems,
                              "dead_workers": sweep.dead_workers,
                              "objective": {"metric": sweep.objective_metric, "mode": sweep.direction.value}
                              if sweep.objective_metric else None, "runs": runs, "gpu_hours": sweep.gpu_hours()},
                             indent=1, default=str))
        else:
            if watch and con.is_terminal:
                con.clear()
            if watch:
                con.print(f"[dim]{time.strftime('%H:%M:%S')}  refreshing every {interval_s:g}s until all runs "
                          f"have ended (Ctrl-C to stop)[/]")
            with reader.quiet_gc():
                render(sweep, con)
        if not watch or not sweep.active():
            return exit_code(sweep)
        time.sleep(interval_s)

