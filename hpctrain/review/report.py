"""``hpctrain report``: every run ranked by one metric, the best with the command that reproduces it,
failed runs with the end of their error; report.md, results.csv, results.json and PNGs in the sweep dir.
"""

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from rich.markup import escape

from hpctrain.core import manifest as manifests
from hpctrain.core import summary as summaries
from hpctrain.core.atomic import write_text_atomic
from hpctrain.core.state import FAILURES, Direction, State
from hpctrain.submit import provenance
from hpctrain.review import cost as costs
from hpctrain.review import fmt, lineage, plots
from hpctrain.review import hardware as ran_on
from hpctrain.review import stragglers as slow
from hpctrain.review import search as search_review
from hpctrain.review.plots import Curve, read_scalars
from hpctrain.review.ranking import (
    Ranking,
    available_metrics,
    default_metric,
    default_mode,
    markdown,
    objective,
    csv_text,
    json_data,
    rank,
    reproduce_command,
    result_rows,
)
from hpctrain.review import reader
from hpctrain.review.status import counts_line
from hpctrain.review.sweep import load_sweep

CURVE_TAGS = ("train/loss", "val/loss")
MAX_ERRORS = 10  # failed runs whose error is printed on the terminal (report.md has them all)


def _table(ranking: Ranking, swept: List[str], con: Any) -> None:
    other = "val/loss" if ranking.metric == "train/loss" else "train/loss"
    records = [x.record for x in ranking.runs]
    if not any(other in r.metrics for r in records):  # any Hydra app: its other returned metric, if any
        other = next((k for r in records for k in r.metrics if k != ranking.metric), other)
    headers = ["rank", "#", ", ".join(swept) or "overrides", "state", ranking.metric, other, "step", "elapsed"]
    rows, styles, row_styles = [], [], []
    for x in ranking.runs:
        r, is_best = x.record, x is ranking.best
        values = fmt.label(r.values, r.overrides)
        rows.append([("* " if is_best else "") + str(x.rank or "-"), str(r.idx), values, r.state,
                     fmt.number(x.value), fmt.number(r.metrics.get(other)),
                     fmt.bar(r.step, r.max_steps, width=0).split(" ")[0], fmt.duration(r.elapsed_s)])
        styles.append([None, None, None, None if is_best else fmt.STATE_STYLE.get(r.state), None, None, None, None])
        row_styles.append("bold green" if is_best else None)
    if not any(x.record.step for x in ranking.runs):  # an app without steps (any Hydra app): no empty column
        headers, rows, styles = [h for i, h in enumerate(headers) if i != 6], [r[:6] + r[7:] for r in rows], \
            [s[:6] + s[7:] for s in styles]
    fmt.table(con, headers, rows, right=tuple(range(4, len(headers))) + (0, 1), styles=styles, row_styles=row_styles)


def _plots(ranking: Ranking, curves: Dict[int, Dict[str, Curve]], swept: List[str], sweep_dir: Path,
           suffix: str = "") -> List[Path]:
    """The PNGs, named with ``suffix`` when ranked by another metric than the default (beside the default ones)."""
    best = ranking.best.record.idx if ranking.best else None
    labels = {x.record.idx: fmt.label(x.record.values, x.record.overrides) for x in ranking.runs}
    pruned = {x.record.idx for x in ranking.runs if x.record.state is State.PRUNED}
    out = []
    drawn = {idx: c for idx, c in curves.items() if c}
    if drawn:
        out.append(plots.loss_curves(drawn, labels, best, sweep_dir / f"loss_curves{suffix}.png", ranking.metric))
    for param in swept:
        points = [(x.record.values[param], x.value, x.record.idx) for x in ranking.runs
                  if x.value is not None and param in x.record.values]
        if points:
            missing = len(ranking.runs) - len(points)
            groups = {x.record.idx: [(k, x.record.values[k]) for k in swept if k != param and k in x.record.values]
                      for x in ranking.runs}  # a panel per combination of the other swept keys
            out.append(plots.metric_vs_param(param, points, ranking.metric, best, missing,
                                             sweep_dir / plots.file_name(param, suffix), groups, pruned))
    return out


def _suffix(metric: str, mode: Direction, usual: str, usual_mode: Direction) -> str:
    """``""`` for the default report; ``-by-train_loss-max`` for one ranked otherwise (its files beside)."""
    if (metric, mode) == (usual, usual_mode):
        return ""
    return "-by-" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", metric) + f"-{Direction(mode).value}"


def cost_section(sweep: reader.Sweep) -> List[str]:
    """The report's cost lines: the total by state, then the runs whose GPUs idled."""
    lines = [costs.total_line(sweep.runs), costs.redone_line(sweep.runs)]
    return [line for line in lines if line] + costs.low_utilisation(sweep.runs)


FORMATS = ("csv", "md", "json")  # --format: that one file's text on stdout, the rest on stderr


def run(sweep_dir: Path, metric: Optional[str] = None, mode: Optional[str] = None, form: Optional[str] = None) -> int:
    from rich.text import Text

    con = fmt.console(sys.stderr if form else None)
    wanted = Direction.parse(mode) if mode else None
    sweep = reader.read(load_sweep(sweep_dir))
    records, swept = sweep.runs, sweep.swept
    declared_metric = (objective(records) or {}).get("metric")  # its curve is drawn below the losses
    tags = set(CURVE_TAGS) | ({metric} if metric else set()) | ({declared_metric} if declared_metric else set())
    curves = {r.idx: read_scalars(r.run_dir, tags) for r in records}
    last = {idx: {tag: pts[-1][1] for tag, pts in c.items() if pts} for idx, c in curves.items()}
    manifest = manifests.read(sweep_dir)
    search_metric, search_mode = search_review.ranking_metric(manifest)  # a search: ranked by its objective
    usual = search_metric or default_metric(records, last)
    usual_mode = search_mode if usual == search_metric and search_mode else default_mode(usual, records)
    metric = metric or usual
    wanted = wanted or (search_mode if metric == search_metric else None)
    have = available_metrics(records, last)
    if metric not in have:
        hint = f"available: {', '.join(have)}" if have else "no run has any metric yet: see `hpctrain status`"
        print(f"hpctrain report: error: no run of {sweep_dir} has the metric {metric!r} ({hint})", file=sys.stderr)
        return 2
    declared = objective(records)
    is_objective = declared is not None and declared.get("metric") == metric and wanted in (None, declared.get("mode"))
    ranking = rank(records, metric, wanted or default_mode(metric, records), last)
    command = reproduce_command(ranking.best.record, manifest.app if manifest else None) if ranking.best else None
    pbt_lines, replay, pbt_images = lineage.section(ranking, records, manifest.app if manifest else None, sweep_dir)
    pbt_said = lineage.params_said(ranking, records)  # which params: the launch summary says the same
    command = replay or command  # a PBT trial reproduces by its schedule replayed as one run, not its start values
    code: List[str] = []  # the commit(s) the best run's code came from; its command reruns that code
    if ranking.best and command:
        best_dir = Path(ranking.best.record.run_dir) if ranking.best.record.run_dir else None
        command, code = provenance.for_report(sweep_dir, ranking.best.record.idx, command, best_dir)

    con.print(f"[bold]sweep[/] {escape(str(sweep_dir))}  ranked by [bold]{escape(metric)}[/] ({ranking.mode}"
              f"{', the objective' if is_objective else ''})",
              soft_wrap=True)
    _table(ranking, swept, con)
    con.print(counts_line(sweep), soft_wrap=True)
    cost_lines = cost_section(sweep)
    ranked = [x.record for x in ranking.runs]
    mixed = ran_on.mixed_warning(ranked)
    repeat = slow.repeat_line(records)  # a node that hung or straggled in two or more runs/attempts
    hardware_lines = ran_on.lines(ranked) + ([f"warning: {mixed}"] if mixed else []) + (
        [f"warning: {repeat}"] if repeat else [])
    for line in cost_lines + hardware_lines + [f"warning: {p}" for p in sweep.problems]:
        con.print(line, soft_wrap=True, markup=False, highlight=False)
    if ranking.best:
        b = ranking.best
        label = fmt.label(b.record.values, b.record.overrides)
        con.print(f"\n[bold green]best:[/] #{b.record.idx} {escape(label)}  {escape(metric)} = {fmt.number(b.value)}"
                  f" ({'objective, ' if is_objective else ''}{ranking.mode})"
                  f"{'  (' + ranking.best_note + ')' if ranking.best_note else ''}", soft_wrap=True)
        if pbt_said:
            con.print(f"  PBT: {pbt_said}", soft_wrap=True, markup=False, highlight=False)
        con.print(Text.assemble(("reproduce: ", "bold"), command or ""), soft_wrap=True)
        for line in code:
            con.print(Text.assemble(("code: ", "bold"), line), soft_wrap=True)
    rungs = search_review.rung_table((sweep.listing.search if sweep.listing is not None else None) or {}, [(r.idx, r.state, summaries.read(r.run_dir) or {})
                                                            for r in records if r.run_dir])
    if rungs:  # ASHA's rung table: trials per rung, promoted from it, the best there
        con.print("\n[bold]rungs[/] (bracket, rung, step: trials, promoted, best)", soft_wrap=True)
        for row in rungs:
            best = "-" if row["best"] is None else f"{fmt.number(row['best'])} (#{row['best_trial']})"
            con.print(f"  {row['bracket']}  rung {row['rung']}  step {row['step']}: {row['trials']} trial(s), "
                      f"{row['promoted']} promoted, best {best}", soft_wrap=True, markup=False, highlight=False)
    for line in pbt_lines:
        con.print(line, soft_wrap=True, markup=False, highlight=False)
    if replay:
        con.print(Text.assemble(("replay as one run: ", "bold"), replay), soft_wrap=True)
    failed = [x.record for x in ranking.runs if x.record.state in FAILURES]
    for r in failed[:MAX_ERRORS]:
        lines = [line for line in (r.error or "").splitlines() if line.strip()][-5:]
        label = fmt.label(r.values, r.overrides)
        con.print(f"\n[red]#{r.idx} {escape(label)} {r.state}[/] (log: {escape(fmt.short_path(r.log))})",
                  soft_wrap=True)
        for line in lines or [r.note or "(no error recorded)"]:
            con.print("    " + line, soft_wrap=True, markup=False, highlight=False)
    if len(failed) > MAX_ERRORS:
        con.print(f"\n... and {len(failed) - MAX_ERRORS} more failed runs: their errors are in report.md",
                  soft_wrap=True)

    try:
        suffix = _suffix(metric, ranking.mode, usual, usual_mode) if usual in have else ""  # no default report: the only one
        images = _plots(ranking, curves, swept, sweep_dir, suffix) + pbt_images
        if sweep.listing is not None and sweep.listing.search is not None:  # each trial's objective and the best so far
            points = [(x.record.idx, x.value, x.record.state) for x in ranking.runs if x.value is not None]
            if points:
                images.append(search_review.history_plot(points, metric, ranking.mode,
                                                         sweep_dir / f"optimisation_history{suffix}.png"))
        names = [f"report{suffix}.md", f"results{suffix}.csv", f"results{suffix}.json"]
        texts = {"csv": csv_text(result_rows(ranking, swept)),
                 "json": json.dumps(json_data(ranking, sweep_dir, sweep.counts(), command, images), indent=1,
                                    sort_keys=True, default=str)}
        cost_md = "\n## Cost\n\n" + "\n".join(f"- {line}" for line in cost_lines) + "\n" if cost_lines else ""
        hardware_md = "\n## Hardware\n\n" + "\n".join(f"- {line}" for line in hardware_lines) + "\n" if hardware_lines else ""
        texts["md"] = markdown(ranking, sweep_dir, swept, sweep.counts(), command, images) + cost_md + hardware_md
        for name, key in zip(names, ("md", "csv", "json")):
            write_text_atomic(sweep_dir / name, texts[key])
    except OSError as exc:
        print(f"hpctrain report: error: cannot write the report into {sweep_dir}: {exc}", file=sys.stderr)
        return 1
    names += [p.name for p in images]
    con.print(f"\nwrote into {fmt.short_path(str(sweep_dir))}/: " + ", ".join(names), soft_wrap=True, markup=False)
    if form:
        sys.stdout.write(texts[form] if texts[form].endswith("\n") else texts[form] + "\n")
    return 0
