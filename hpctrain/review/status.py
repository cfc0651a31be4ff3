"""``hpctrain status``: one row per run, then the count per state; ``--watch`` until every run has ended.

Login-node code: rich and the run files only (no torch, no matplotlib, no TensorBoard).
"""

import json
import time
from pathlib import Path
from typing import Any, List

from hpctrain.review import fmt
from hpctrain.review.runs import FAILURES, STATES, Snapshot, collect
from hpctrain.review.sweepdir import load_sweep


def table(snap: Snapshot, con: Any) -> Any:
    from rich import box
    from rich.table import Table

    fancy = fmt.unicode_ok(con)
    t = Table(box=box.SIMPLE_HEAD if fancy else box.ASCII2, safe_box=not fancy, pad_edge=False,
              show_edge=False)
    t.add_column("#", justify="right")
    t.add_column(", ".join(snap.sweep.swept) or "overrides", no_wrap=True)
    t.add_column("state", no_wrap=True)
    t.add_column("progress", no_wrap=True)
    t.add_column("loss", justify="right")
    t.add_column("elapsed", justify="right")
    t.add_column("restarts", justify="right")
    t.add_column("log", overflow="fold")
    for r in snap.runs:
        values = " ".join(f"{k}={v}" for k, v in r.values.items()) or " ".join(r.overrides) or "(defaults)"
        t.add_row(
            str(r.idx), values, f"[{fmt.STATE_STYLE.get(r.state, '')}]{r.state}[/]",
            fmt.bar(r.step, r.max_steps, fancy=fancy), fmt.number(r.loss), fmt.duration(r.elapsed_s),
            str(r.restarts), fmt.short_path(r.log),
        )
    return t


def print_table(t: Any, con: Any) -> None:
    """On a terminal as rich draws it; piped, without the padding at the ends of lines."""
    if con.is_terminal:
        con.print(t)
        return
    with con.capture() as cap:
        con.print(t)
    con.file.write("\n".join(line.rstrip() for line in cap.get().splitlines()) + "\n")


def counts_line(snap: Snapshot) -> str:
    counts = snap.counts()
    parts = [f"[{fmt.STATE_STYLE[s]}]{counts[s]} {s}[/]" for s in STATES if s in counts]
    return f"{len(snap.runs)} runs: " + ", ".join(parts)


def render(snap: Snapshot, con: Any) -> None:
    sweep = snap.sweep
    con.print(f"[bold]sweep[/] {sweep.dir}  ({sweep.launcher}, {len(sweep.runs)} runs"
              f"{', no manifest yet' if not sweep.has_manifest else ''})", soft_wrap=True)
    print_table(table(snap, con), con)
    for r in snap.runs:
        if r.state in FAILURES and r.error:
            last = r.error.strip().splitlines()[-1]
            con.print(f"  [red]#{r.idx} {r.state}:[/] {last}", soft_wrap=True)
        elif r.note and r.state not in ("pending", "running", "completed"):
            con.print(f"  [dim]#{r.idx} {r.state}: {r.note}[/]", soft_wrap=True)
    for w in snap.warnings:
        con.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    con.print(counts_line(snap), soft_wrap=True)


def exit_code(snap: Snapshot) -> int:
    return 1 if any(r.state in FAILURES for r in snap.runs) else 0


def run(sweep_dir: Path, watch: bool = False, interval_s: float = 10.0, as_json: bool = False) -> int:
    con = fmt.console()
    while True:
        snap = collect(load_sweep(sweep_dir))
        if as_json:
            print(json.dumps({"sweep_dir": str(sweep_dir), "counts": snap.counts(), "warnings": snap.warnings,
                              "runs": [r.to_dict() for r in snap.runs]}, indent=1, default=str))
        else:
            if watch and con.is_terminal:
                con.clear()
            if watch:
                con.print(f"[dim]{time.strftime('%H:%M:%S')}  refreshing every {interval_s:g}s until all runs "
                          f"have ended (Ctrl-C to stop)[/]")
            render(snap, con)
        if not watch or not snap.active():
            return exit_code(snap)
        time.sleep(interval_s)


def active_runs(sweep_dir: Path) -> List[int]:
    return [r.idx for r in collect(load_sweep(sweep_dir)).active()]
