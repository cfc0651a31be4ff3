"""The report's plots, checked on the data behind them (matplotlib's artists as drawn, captured before each
PNG is written), on a 2-D sweep written by hand: facets by the other swept key, a colour per run in every
plot and every call, the objective's curve, pruned runs marked, 4 significant digits shown and the full
value kept in the data files; ``report --metric`` writes beside the default report."""

import csv
import json
from pathlib import Path

import pytest
from matplotlib.colors import to_rgba

from hpctrain.core import events
from hpctrain.review import plots, report

LRS = ["0.001", "0.01", "0.1"]
WIDTHS = ["8", "16"]
LONG_LR = "0.0028002728307563543"  # a search's value: shown as 0.0028


def _accuracy(lr: float, width: int) -> float:
    return round(0.5 + width / 100 - abs(lr - 0.01) * 2, 6)


@pytest.fixture
def sweep(tmp_path) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path / "sweep"
    root.mkdir()
    points = [(lr, w) for w in WIDTHS for lr in LRS] + [(LONG_LR, "8")]
    manifest = {"launcher": "local", "submitit_folder": str(root / ".submitit"), "submissions": [], "runs": {}}
    for idx, (lr, width) in enumerate(points):
        name = f"{idx}_lr={lr},model.width={width}"
        run_dir = root / name
        run_dir.mkdir()
        manifest["runs"][str(idx)] = {"name": name, "run_dir": name, "job_id": None, "max_steps": 10,
                                      "overrides": [f"lr={lr}", f"model.width={width}", "max_steps=10"]}
        acc = _accuracy(float(lr), int(width)) if lr != LONG_LR else 0.2
        writer = SummaryWriter(str(run_dir / "tb"))
        for step in (0, 5, 10):
            writer.add_scalar("train/loss", 2.0 - step * float(lr), step)
            writer.add_scalar("val/loss", 2.1 - step * float(lr), step)
            writer.add_scalar("val/accuracy", acc * step / 10, step)
        writer.close()
        events.submitted(run_dir)
        events.started(run_dir)
        if lr == LONG_LR:
            events.pruned(run_dir, step=5, reason="median")
        else:
            events.completed(run_dir)
        (run_dir / "metrics.json").write_text(json.dumps({
            "step": 10, "max_steps": 10, "objective": {"metric": "val/accuracy", "mode": "max"},
            "metrics": {"train/loss": 2.0 - 10 * float(lr), "val/loss": 2.1 - 10 * float(lr), "val/accuracy": acc}}))
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the report draws, by file name, as it was when written."""
    figures = {}
    save = plots._save

    def capture(fig, plt, path):
        figures[path.name] = fig
        return save(fig, plt, path)

    monkeypatch.setattr(plots, "_save", capture)
    return figures


def _points(ax):
    """(x, y, idx, hollow) of every run drawn on ``ax``; idx from its legend label, or its colour."""
    out = []
    for c in ax.collections:
        (x, y), = c.get_offsets().tolist()
        edge = tuple(c.get_edgecolor()[0]) if len(c.get_edgecolor()) else None
        face = tuple(c.get_facecolor()[0]) if len(c.get_facecolor()) else None
        hollow = face is None or face[3] == 0
        colour = edge if hollow else face
        (idx,) = [i for i in range(20) if to_rgba(plots.run_colour(i)) == colour]
        out.append((x, y, idx, hollow))
    return sorted(out)


def test_report_facets_by_the_other_key_marks_pruned_runs_and_keeps_each_runs_colour(sweep, drawn, capsys):
    assert report.run(sweep) == 0
    out = capsys.readouterr().out
    fig = drawn["metric_vs_lr.png"]
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["model.width=8", "model.width=16"]
    narrow, wide = (_points(ax) for ax in axes)
    assert [(x, idx, hollow) for x, _, idx, hollow in narrow] == [
        (0.001, 0, False), (float(LONG_LR), 6, True), (0.01, 1, False), (0.1, 2, False)]
    assert [(x, idx) for x, _, idx, _ in wide] == [(0.001, 3), (0.01, 4), (0.1, 5)]
    assert [y for _, y, _, _ in wide] == [_accuracy(float(lr), 16) for lr in LRS]  # the objective, per facet
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "#6 (pruned: value when stopped)" in legend
    best = max(range(6), key=lambda i: _accuracy(float(LRS[i % 3]), int(WIDTHS[i // 3])))
    assert f"#{best} (best)" in [t.get_text() for t in axes[1].get_legend().get_texts()]
    # the other plot: a facet per lr, the long value to 4 significant digits
    titles = [ax.get_title() for ax in drawn["metric_vs_model.width.png"].axes if ax.get_visible()]
    assert titles == ["lr=0.001", "lr=0.0028", "lr=0.01", "lr=0.1"]

    # the loss curves, and the objective's own curve below them, each run in its colour
    losses, objective = drawn["loss_curves.png"].axes
    assert objective.get_ylabel() == "val/accuracy"
    lines = {to_rgba(line.get_color()): list(line.get_ydata()) for line in objective.get_lines()}
    for idx in range(6):
        acc = _accuracy(float(LRS[idx % 3]), int(WIDTHS[idx // 3]))
        assert lines[to_rgba(plots.run_colour(idx))] == pytest.approx([0, acc / 2, acc])
    labels = [t.get_text() for t in losses.get_legend().get_texts()]
    assert "#6 lr=0.0028 model.width=8" in labels and f"#{best} lr={LRS[best % 3]} model.width={WIDTHS[best // 3]} (best)" in labels

    # 4 significant digits on the terminal and in report.md; the full value in the data files
    assert "lr=0.0028 " in out and LONG_LR not in out.split("reproduce:")[0]
    assert "| 0.0028 |" in (sweep / "report.md").read_text()
    rows = list(csv.DictReader(open(sweep / "results.csv")))
    assert [r["lr"] for r in rows if r["idx"] == "6"] == [LONG_LR]
    assert json.loads((sweep / "results.json").read_text())["runs"][-1]["params"]["lr"] == float(LONG_LR)


def test_report_by_another_metric_writes_beside_the_default_and_the_colours_stay(sweep, drawn, capsys):
    assert report.run(sweep) == 0
    default = {p.name: p.read_bytes() for p in sweep.iterdir() if p.is_file() and p.name != "sweep.json"}
    assert {"report.md", "results.csv", "results.json", "loss_curves.png", "metric_vs_lr.png"} <= set(default)
    first = {ax.get_title(): _points(ax) for ax in drawn["metric_vs_lr.png"].axes if ax.get_visible()}

    assert report.run(sweep, metric="train/loss") == 0
    assert "wrote into" in capsys.readouterr().out
    for name, data in default.items():
        assert (sweep / name).read_bytes() == data, f"{name} was overwritten"
    beside = json.loads((sweep / "results-by-train_loss-min.json").read_text())
    assert beside["metric"] == "train/loss" and beside["best"]["idx"] in (2, 5)  # lr=0.1: the lowest train loss
    for name in ("report-by-train_loss-min.md", "results-by-train_loss-min.csv", "loss_curves-by-train_loss-min.png",
                 "metric_vs_lr-by-train_loss-min.png", "metric_vs_model.width-by-train_loss-min.png"):
        assert (sweep / name).stat().st_size > 0, name
    second = {ax.get_title(): _points(ax) for ax in drawn["metric_vs_lr-by-train_loss-min.png"].axes if ax.get_visible()}
    # each run keeps its colour (and its facet) whatever the ranking: only the y values change
    assert {t: [(x, idx) for x, _, idx, _ in p] for t, p in first.items()} == \
           {t: [(x, idx) for x, _, idx, _ in p] for t, p in second.items()}
    # the default metric named explicitly is the default report: no second set of files
    assert report.run(sweep, metric="val/accuracy") == 0
    assert not list(sweep.glob("*-by-val_accuracy*"))


def test_a_search_history_marks_pruned_trials_in_their_runs_colours(tmp_path, drawn):
    from hpctrain.core.state import Direction, State
    from hpctrain.review import search as search_review

    points = [(0, 0.9, State.COMPLETED), (1, 0.5, State.COMPLETED), (2, 3.0, State.PRUNED), (3, 0.7, State.COMPLETED)]
    search_review.history_plot(points, "val/loss", Direction.MIN, tmp_path / "optimisation_history.png")
    ax = drawn["optimisation_history.png"].axes[0]
    trials, stopped = ax.collections
    assert trials.get_offsets().tolist() == [[0, 0.9], [1, 0.5], [3, 0.7]]
    assert [tuple(c) for c in trials.get_facecolor()] == [to_rgba(plots.run_colour(i)) for i in (0, 1, 3)]
    assert stopped.get_offsets().tolist() == [[2, 3.0]]
    assert len(stopped.get_facecolor()) == 0 or stopped.get_facecolor()[0][3] == 0  # hollow
    assert tuple(stopped.get_edgecolor()[0]) == to_rgba(plots.run_colour(2))
    (best,) = ax.get_lines()  # the best so far, pruned trials left out
    assert list(best.get_ydata()) == [0.9, 0.5, 0.5]
