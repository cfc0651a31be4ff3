"""A run's scalar curves, read with TensorBoard's own reader (its EventAccumulator, never by hand), and
the report's PNGs: every run's loss curve on one chart, the metric against each swept parameter.

matplotlib (Agg, no display needed) and TensorBoard are imported inside the functions, so only
``report`` pays for them.
"""

import math
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from hpctrain.core.atomic import write_bytes_atomic
from hpctrain.core.paths import RunPaths

Curve = List[Tuple[int, float]]  # (step, value)


def read_scalars(run_dir: Optional[str], tags: Iterable[str]) -> Dict[str, Curve]:
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


def scalar_tags(run_dir: Optional[str]) -> List[str]:
    if not run_dir or not RunPaths(run_dir).tb.is_dir():
        return []
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(RunPaths(run_dir).tb), size_guidance={ea.SCALARS: 1})
    try:
        acc.Reload()
    except Exception:  # noqa: BLE001
        return []
    return sorted(acc.Tags().get("scalars", []))


LEGEND_MAX = 12  # more runs than this: only the best one is named in the legend
SIZE_IN, DPI = (9.0, 5.5), 110


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


def file_name(param: str) -> str:
    return "metric_vs_" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", param) + ".png"


def loss_curves(curves: Dict[int, Dict[str, Curve]], labels: Dict[int, str], best: Optional[int],
                path: Path) -> Path:
    """train/loss as lines (val/loss dashed, same colour), the best run drawn on top and thicker."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE_IN, dpi=DPI)
    cmap = plt.get_cmap("viridis" if len(curves) > 10 else "tab10")
    named = len(curves) <= LEGEND_MAX
    all_values = []
    for n, (idx, tags) in enumerate(sorted(curves.items(), key=lambda kv: kv[0] == best)):
        colour = "crimson" if idx == best else cmap(n / max(1, len(curves) - 1) if len(curves) > 10 else n % 10)
        width, alpha = (2.6, 1.0) if idx == best else (1.2, 0.85 if named else 0.45)
        label = f"#{idx} {labels[idx]}" + (" (best)" if idx == best else "")
        for tag, style in (("train/loss", "-"), ("val/loss", "--")):
            points = tags.get(tag)
            if not points:
                continue
            steps, values = zip(*points)
            all_values += [v for v in values if math.isfinite(v)]
            show = (named or idx == best) and tag == "train/loss"
            ax.plot(steps, values, style, color=colour, lw=width, alpha=alpha, label=(label if show else None),
                    marker="o" if tag == "val/loss" else None, ms=3)
    if spans_decades(all_values):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"Loss curves of {len(curves)} runs (train solid, validation dashed)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="best")
    return _save(fig, plt, path)


def metric_vs_param(param: str, points: List[Tuple[str, float, int]], metric: str, best: Optional[int],
                    missing: int, path: Path) -> Path:
    """One point per run with a value: ``(param value, metric value, run idx)``; log x for values spanning decades."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE_IN, dpi=DPI)
    raw = [p[0] for p in points]
    numbers = as_numbers(raw)
    if numbers is not None:
        xs = numbers
        if spans_decades(numbers):
            ax.set_xscale("log")
    else:
        categories = sorted(set(raw))
        xs = [float(categories.index(v)) for v in raw]
        ax.set_xticks(range(len(categories)), categories, rotation=30 if len(categories) > 4 else 0)
    ys = [p[1] for p in points]
    ax.scatter(xs, ys, s=40, color="tab:blue", zorder=2, label="runs")
    for x, y, (_, _, idx) in zip(xs, ys, points):
        if idx == best:
            ax.scatter([x], [y], s=220, marker="*", color="crimson", zorder=3, label=f"best (#{idx})")
    finite = [y for y in ys if math.isfinite(y)]
    if spans_decades(finite):
        ax.set_yscale("log")
    ax.set_xlabel(param)
    ax.set_ylabel(metric)
    note = f", {missing} without a value" if missing else ""
    ax.set_title(f"{metric} vs {param} ({len(points)} run{'s' if len(points) != 1 else ''}{note})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="best")
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
