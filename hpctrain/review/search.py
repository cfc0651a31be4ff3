"""What ``status`` and ``report`` need to know about a search sweep, from the sweep dir's own files.

No optuna and no torch: the trials are runs of the sweep (sweep.json lists them by trial number, their
metrics.json holds the state and the objective); the search settings are in sweep.json's ``search``.
"""

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpctrain.core.manifest import Manifest
from hpctrain.core.state import Direction, State


def settings(found: Optional[Manifest]) -> Optional[Dict[str, Any]]:
    """``{"metric": "val/loss", "direction": "minimize", ...}`` for a search sweep, else None."""
    return found.search if found is not None else None


def direction(search: Dict[str, Any]) -> Direction:
    """A search's direction as sweep.json holds it (Optuna's spelling); minimise when unreadable."""
    try:
        return Direction.parse(search.get("direction") or Direction.MIN)
    except ValueError:
        return Direction.MIN


def ranking_metric(manifest: Optional[Manifest]) -> Tuple[Optional[str], Optional[Direction]]:
    """The metric and mode ``report`` ranks a search sweep by: its objective (``value``: the return value)."""
    s = settings(manifest)
    if s is None:
        return None, None
    return (s.get("metric") or "value"), direction(s)


def objective(metrics_json: Dict[str, Any], metric: Optional[str] = None) -> Optional[float]:
    """A trial's objective: what its worker told the study, else the latest value of ``metric``."""
    told = metrics_json.get("objective")
    if isinstance(told, dict) and isinstance(told.get("value"), (int, float)):
        return float(told["value"])
    value = (metrics_json.get("metrics") or {}).get(metric or "")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def history_plot(points: List[Tuple[int, float, State]], metric: str, mode: Direction, path: Path) -> Path:
    """The optimisation history: each trial's objective by trial number (pruned ones hollow), and the best
    so far as a step line. ``points``: (trial number, objective, state)."""
    from hpctrain.review import plots

    plt = plots._plt()
    fig, ax = plt.subplots(figsize=plots.SIZE_IN, dpi=plots.DPI)
    points = sorted(points)
    done = [(n, v) for n, v, s in points if s is not State.PRUNED]
    pruned = [(n, v) for n, v, s in points if s is State.PRUNED]
    if done:
        ax.scatter([n for n, _ in done], [v for _, v in done], color="tab:blue", label="trial", zorder=3)
    if pruned:
        ax.scatter([n for n, _ in pruned], [v for _, v in pruned], facecolors="none", edgecolors="tab:gray",
                   label="pruned (value when stopped)", zorder=3)
    best, xs, ys = None, [], []
    for n, v in done:
        best = v if best is None or mode.better(v, best) else best
        xs.append(n)
        ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="tab:red", label="best so far")
    values = [v for _, v, _ in points]
    if plots.spans_decades(values):
        ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"optimisation history ({len(points)} trials, {mode} {metric})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return plots._save(fig, plt, path)


def rung_table(search: Dict[str, Any], trials: List[Tuple[int, State, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """ASHA's (or Hyperband's) rung table from the trials' metrics.json (``rung``, ``bracket``, ``values_at``):
    per bracket and rung its step, the trials that reached it, how many were promoted from it, the best value.
    Empty for a search without those schedulers. ``trials``: (number, state, metrics.json)."""
    name = search.get("scheduler")
    if name not in ("asha", "hyperband") or not search.get("min_steps") or not search.get("max_steps"):
        return []
    from hpctrain.search.asha import Asha, hyperband
    from hpctrain.search.units import StudyView, TrialView, Unit, UnitKind

    first, eta, last = int(search["min_steps"]), int(search.get("eta") or 3), int(search["max_steps"])
    sched = hyperband(first, eta, last) if name == "hyperband" else Asha(first, eta, last)
    views = []
    for number, state, m in trials:
        values = {int(k): float(v) for k, v in (m.get("values_at") or {}).items()
                  if str(k).isdigit() and isinstance(v, (int, float))}
        rung = m.get("rung")
        unit = Unit(number, UnitKind.NEW, 0, 0, index=int(rung), bracket=int(m.get("bracket") or 0)) \
            if isinstance(rung, int) else None
        views.append(TrialView(number, state, {}, values, unit))
    return sched.table(StudyView(views, len(views), last, direction(search)))
