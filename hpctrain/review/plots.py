"""A run's scalar curves, read with TensorBoard's own reader (its EventAccumulator, never by hand), and
the report's PNGs: every run's loss curve on one chart, the metric against each swept parameter.

matplotlib (Agg, no display needed) and TensorBoard are imported inside the functions, so only
``report`` pays for them.
"""

import math
import re
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpctrain.core.atomic import write_bytes_atomic
from hpctrain.core.paths import RunPaths
from hpctrain.review import fmt

Curve = List[Tuple[int, float]]  # (step, value)


def read_scalars(run_dir: "Optional[str | Path]", tags: Iterable[str]) -> Dict[str, Curve]:
    """``{tag: [(step, value), ...]}`` for those of ``tags`` the run's ``tb/`` holds; {} without events."""
    if not run_dir:
        return {}
    tb_dir = RunPaths(run_dir).tb
    if not tb_dir.is_dir() or not any(p.name.startswith("events.out.tfevents") for p in tb_dir.iterdir()):
        return {}
    from tensorboard.backend.event_processing import event_accumulator as ea

    # keep every scalar; load as little as possible of the other kinds
    guidance = {ea.SCALARS: 0, ea.TENSORS: 1, ea.HISTOGRAMS: 1, ea.COMPRESSED_HISTOGRAMS: 1, ea.IMAGES: 1, ea.AUDIO: 1}
    acc = ea.EventAccumulator(str(tb_dir), size_guidance=guidance)
    try:
        acc.Reload()
    except Exception:  # noqa: BLE001 - a truncated event file (a run killed mid-write) is not fatal
        return {}
    have = set(acc.Tags().get("scalars", []))
    return {tag: [(int(e.step), float(e.value)) for e in acc.Scalars(tag)] for tag in tags if tag in have}


LEGEND_MAX = 12  # more runs than this: only the best one is named in the legend
MAX_FACETS = 12  # more combinations of the other swept keys than this: one panel, the runs' colours tell them apart
SIZE_IN, DPI = (9.0, 5.5), 110
LOSS_TAGS = ("train/loss", "val/loss")
# a run's colour is its index's, in every plot and every report call (matplotlib's tab20, tab10 first)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
           "#dbdb8d", "#9edae5")


def run_colour(idx: int) -> str:
    return PALETTE[idx % len(PALETTE)]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def spans_decades(values: Sequence[float]) -> bool:
    """Positive values whose largest is at least ten times the smallest: a log axis reads them better."""
    return bool(values) and min(values) > 0 and max(values) / min(values) >= 10


def as_numbers(values: Sequence[str]) -> Optional[List[float]]:
    try:
        out = [float(v) for v in values]
    except ValueError:
        return None
    return out if all(math.isfinite(v) for v in out) else None


def file_name(param: str, suffix: str = "") -> str:
    return "metric_vs_" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", param) + suffix + ".png"


def loss_curves(curves: Dict[int, Dict[str, Curve]], labels: Dict[int, str], best: Optional[int],
                path: Path, metric: Optional[str] = None) -> Path:
    """train/loss as lines (val/loss dashed, same colour), each run in its own colour, the best one drawn on
    top and thicker; a ``metric`` that is not a loss (the objective: accuracy) in a panel of its own below."""
    plt = _plt()
    extra = metric if metric and metric not in LOSS_TAGS and any(c.get(metric) for c in curves.values()) else None
    if extra:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(SIZE_IN[0], SIZE_IN[1] * 1.5), dpi=DPI, sharex=True)
    else:
        fig, ax = plt.subplots(figsize=SIZE_IN, dpi=DPI)
        ax2 = None
    named = len(curves) <= LEGEND_MAX
    all_values: List[float] = []
    extra_values: List[float] = []
    for idx, tags in sorted(curves.items(), key=lambda kv: (kv[0] == best, kv[0])):
        colour = run_colour(idx)
        width, alpha = (2.6, 1.0) if idx == best else (1.2, 0.85 if named else 0.45)
        label = f"#{idx} {labels[idx]}" + (" (best)" if idx == best else "")
        z = 3 if idx == best else 2
        for tag, style in (("train/loss", "-"), ("val/loss", "--")):
            points = tags.get(tag)
            if not points:
                continue
            steps, values = zip(*points)
            all_values += [v for v in values if math.isfinite(v)]
            show = (named or idx == best) and tag == "train/loss"
            ax.plot(steps, values, style, color=colour, lw=width, alpha=alpha, label=(label if show else None),
                    marker="o" if tag == "val/loss" else None, ms=3, zorder=z)
        if ax2 is not None and extra and tags.get(extra):
            steps, values = zip(*tags[extra])
            extra_values += [v for v in values if math.isfinite(v)]
            ax2.plot(steps, values, "-", color=colour, lw=width, alpha=alpha, marker="o", ms=3, zorder=z,
                     label=(label if named or idx == best else None))
    if spans_decades(all_values):
        ax.set_yscale("log")
    ax.set_ylabel("loss")
    ax.set_title(f"Loss curves of {len(curves)} runs (train solid, validation dashed)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="best")
    if ax2 is not None:
        if spans_decades(extra_values):
            ax2.set_yscale("log")
        ax2.set_ylabel(str(extra))
        ax2.set_title(f"{extra}, the metric ranked by")
        ax2.grid(True, alpha=0.3)
    (ax2 or ax).set_xlabel("step")
    return _save(fig, plt, path)


Point = Tuple[str, float, int]  # (param value, metric value, run idx)


def _sort_key(text: str) -> Tuple[int, float, str]:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def facets_of(points: Sequence[Point], groups: Mapping[int, Sequence[Tuple[str, str]]]) -> List[Tuple[str, List[Point]]]:
    """The panels of a metric-vs-parameter plot: one per combination of the other swept keys' values
    (``groups``: run idx -> ((key, value), ...)), in the order of those values; one panel without any."""
    by: Dict[Tuple[Tuple[str, str], ...], List[Point]] = {}
    for p in points:
        by.setdefault(tuple(groups.get(p[2], ())), []).append(p)
    ordered = sorted(by.items(), key=lambda kv: [_sort_key(v) for _, v in kv[0]])
    return [(" ".join(f"{k}={fmt.value(v)}" for k, v in key), pts) for key, pts in ordered]


def metric_vs_param(param: str, points: List[Point], metric: str, best: Optional[int], missing: int, path: Path,
                    groups: Optional[Mapping[int, Sequence[Tuple[str, str]]]] = None,
                    pruned: Iterable[int] = ()) -> Path:
    """One point per run with a value, in the run's colour, a panel per combination of the other swept keys
    (``groups``); pruned runs hollow (their value when stopped); log x for values spanning decades."""
    plt = _plt()
    pruned = set(pruned)
    facets = facets_of(points, groups or {})
    mixed = len(facets) > MAX_FACETS
    if mixed:
        facets = [("", list(points))]
    cols = min(3, len(facets))
    rows = math.ceil(len(facets) / cols)
    size = SIZE_IN if len(facets) == 1 else (SIZE_IN[0] * min(1.6, 0.6 * cols + 0.4), max(SIZE_IN[1], 3.6 * rows))
    fig, axes = plt.subplots(rows, cols, figsize=size, dpi=DPI, sharex=True, sharey=True, squeeze=False)
    raw = [p[0] for p in points]
    numbers = as_numbers(raw)
    categories = sorted(set(raw), key=_sort_key)
    finite = [p[1] for p in points if math.isfinite(p[1])]
    for n, ax in enumerate(axes.flat):
        if n >= len(facets):
            ax.set_visible(False)
            continue
        title, pts = facets[n]
        pts = sorted(pts, key=lambda p: _sort_key(p[0]))
        xs = [float(p[0]) if numbers is not None else float(categories.index(p[0])) for p in pts]
        ys = [p[1] for p in pts]
        done = [(x, y) for x, y, p in zip(xs, ys, pts) if p[2] not in pruned]
        if len(done) > 1 and not mixed:  # the facet's runs joined in x order: how the metric moves with it
            ax.plot([x for x, _ in done], [y for _, y in done], "-", color="0.75", lw=1, zorder=1)
        named = len(pts) <= LEGEND_MAX
        for x, y, (_, _, idx) in zip(xs, ys, pts):
            colour = run_colour(idx)  # the run's own, as in the loss curves: the legend says which run
            if idx in pruned:
                ax.scatter([x], [y], s=40, facecolors="none", edgecolors=colour, linewidths=1.5, zorder=2,
                           label=f"#{idx} (pruned: value when stopped)")
            elif idx == best:
                ax.scatter([x], [y], s=240, marker="*", color=colour, edgecolors="black", zorder=3,
                           label=f"#{idx} (best)")
            else:
                ax.scatter([x], [y], s=40, color=colour, zorder=2, label=f"#{idx}" if named else None)
        if title:
            ax.set_title(title, fontsize="medium")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="best")
    first = axes.flat[0]
    if numbers is not None:
        if spans_decades(numbers):
            first.set_xscale("log")
    else:
        first.set_xticks(range(len(categories)), [fmt.value(c) for c in categories],
                         rotation=30 if len(categories) > 4 else 0)
    if spans_decades(finite):
        first.set_yscale("log")
    for ax in axes[-1]:
        ax.set_xlabel(param)
    for ax in axes[:, 0]:
        ax.set_ylabel(metric)
    note = f", {missing} without a value" if missing else ""
    facet_note = f"; other swept keys mixed ({len(facets_of(points, groups or {}))} combinations)" if mixed else ""
    head = f"{metric} vs {param} ({len(points)} run{'s' if len(points) != 1 else ''}{note}{facet_note})"
    if len(facets) == 1 and not facets[0][0]:
        first.set_title(head)
    else:
        fig.suptitle(head)
    return _save(fig, plt, path)


def _save(fig, plt, path: Path) -> Path:
    import io

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return path


def param_schedules(series: Dict[int, List[Tuple[int, Dict[str, object]]]], best: Optional[int],
                    best_schedule: List[Tuple[int, Dict[str, object]]], max_steps: Optional[int],
                    path: Path) -> Path:
    """PBT: each trial's hyperparameters over steps (a step line per trial, one panel per parameter);
    the best trial's schedule (with its donors' stretches) drawn on top."""
    plt = _plt()
    names = sorted({k for points in series.values() for _, params in points for k in params})
    fig, axes = plt.subplots(len(names) or 1, 1, figsize=(SIZE_IN[0], 2.6 * max(1, len(names))), dpi=DPI,
                             squeeze=False)
    cmap = plt.get_cmap("tab10")

    def line(ax, points, name, **style):
        xs, ys = [], []
        for i, (step, params) in enumerate(points):
            end = points[i + 1][0] if i + 1 < len(points) else (max_steps or step)
            value = params.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                xs += [step, end]
                ys += [float(value), float(value)]
        if xs:
            ax.plot(xs, ys, **style)
        return ys

    for ax, name in zip(axes[:, 0], names):
        values: List[float] = []
        for n, (idx, points) in enumerate(sorted(series.items())):
            values += line(ax, points, name, color=cmap(n % 10), lw=1.2, alpha=0.8, label=f"#{idx}")
        if best is not None and best_schedule:
            values += line(ax, best_schedule, name, color="crimson", lw=2.6, label=f"#{best} schedule (best)")
        if spans_decades([v for v in values if v > 0]):
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].set_title(f"PBT: hyperparameters over steps ({len(series)} trials)")
    if axes[0, 0].get_legend_handles_labels()[0] and len(series) <= LEGEND_MAX:
        axes[0, 0].legend(fontsize="small", loc="best")
    return _save(fig, plt, path)
