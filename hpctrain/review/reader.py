"""The one reader of a sweep: its runs (``runs.Run``: record checked against the queue, summary, cost), as
``status``, ``report``, the ``hpctrain`` tab and the Python API (:mod:`hpctrain.api`, which re-exports
:class:`Sweep`, :func:`load` and :func:`read`) see them.

Login side: no torch. Reads through the review layer's single readers (the manifest, the run record,
metrics.json, the queue, accounting); whatever cannot be read is said in ``Sweep.problems``, never raised.
"""

import gc
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from hpctrain.core.state import ACTIVE, Direction, State
from hpctrain.review import hardware as ran_on
from hpctrain.review.ranking import default_mode
from hpctrain.review.runs import Run, collect, state_counts
from hpctrain.review.sweep import SweepListing
from hpctrain.review.sweep import find_sweep_dir, load_sweep

PathLike = Union[str, Path]
Curve = List[Tuple[int, float]]


@dataclass(repr=False)
class Sweep:
    dir: Path
    launcher: str
    runs: List[Run]
    swept: List[str]
    objective_metric: Optional[str]
    direction: Direction
    problems: List[str] = field(default_factory=list)  # what could not be read, one line each
    dead_workers: List[str] = field(default_factory=list)  # a search whose workers all died: each one's error
    process: Optional[subprocess.Popen] = field(default=None, repr=False)  # hpctrain.launch(..., local)
    listing: Optional[SweepListing] = field(default=None, repr=False)  # which runs, from the manifest (review.sweep)
    taken: float = 0.0  # when the runs were read

    def counts(self) -> Dict[State, int]:
        return state_counts(self.runs)

    def active(self) -> List[Run]:
        return [r for r in self.runs if r.state in ACTIVE]

    def best(self, metric: Optional[str] = None, mode: Optional[str] = None) -> Optional[Run]:
        """The best run by the sweep's objective, or by ``metric`` (a key of ``Run.metrics``) in ``mode``
        ("min" or "max"; default: the sweep's direction for its objective, else guessed from the name as
        ``report`` does: accuracy up, loss down); None when no run has the metric. Ray Tune's
        ``ResultGrid.get_best_result(metric, mode)``."""
        direction = self.direction if mode is None and metric in (None, self.objective_metric) else (
            Direction.parse(mode) if mode is not None else default_mode(metric or "", self.runs))
        scored = [(r, _value(r, metric, self.objective_metric)) for r in self.runs]
        numbers = [(r, v) for r, v in scored if v is not None]
        if not numbers:
            return None
        pick = min if direction is Direction.MIN else max
        return pick(numbers, key=lambda rv: rv[1])[0]

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {s.value}" for s, n in self.counts().items()) or "no runs"
        best = self.best()
        shown = f"; best {best.name!r} {self.objective_metric or 'objective'}={best.objective:.4g}" if (
            best is not None and best.objective is not None) else ""
        return f"Sweep({str(self.dir)!r}, {len(self.runs)} runs: {counts}{shown})"

    def gpu_hours(self, state: Optional[State] = None) -> float:
        """GPU-hours of every run, or of the runs that ended ``state`` (completed, failed, cancelled, ...)."""
        return sum(r.cost.gpu_hours for r in self.runs if r.cost and (state is None or r.state is state))

    def redone_gpu_hours(self) -> float:
        """GPU-hours trained again after requeues (the steps between each one's last checkpoint and signal)."""
        return sum(r.cost.redone_gpu_hours for r in self.runs if r.cost)

    def cost_by_state(self) -> Dict[State, float]:
        out: Dict[State, float] = {}
        for r in self.runs:
            if r.cost:
                out[r.state] = out.get(r.state, 0.0) + r.cost.gpu_hours
        return out

    def to_pandas(self) -> Any:
        """One row per run: index, name, a column per swept key and per metric, state, objective, restarts,
        gpu_hours, cpu_hours, wall_s, estimated, requeues, redone_steps, redone_gpu_hours, step, run_dir, and
        what it ran on: gpu_model, gpu_count, driver, cuda (torch's), cuda_driver, cpu_model, nodes."""
        with quiet_gc():
            try:
                import pandas as pd
            except ImportError:
                raise ImportError("Sweep.to_pandas() needs pandas: pip install 'hpctrain[pandas]' (or pandas)") from None
            return pd.DataFrame([_row(r) for r in self.runs])

    def curves(self, tag: str) -> Any:
        """One scalar tag of every run as a long pandas DataFrame (columns run, step, value; ``run`` the run's
        name), read with TensorBoard's own reader; without pandas, :meth:`curve_points`'s dict."""
        points = self.curve_points(tag)
        try:
            import pandas as pd
        except ImportError:
            return points
        rows = [(name, step, value) for name, curve in points.items() for step, value in curve]
        return pd.DataFrame(rows, columns=["run", "step", "value"])

    def curve_points(self, tag: str) -> Dict[str, Curve]:
        """``{run name: [(step, value), ...]}`` of one scalar tag, read with TensorBoard's own reader."""
        from hpctrain.review.plots import read_scalars

        out = {}
        for r in self.runs:
            points = read_scalars(str(r.run_dir) if r.run_dir else None, [tag]).get(tag)
            if points:
                out[r.name] = points
        return out

    def refresh(self) -> "Sweep":
        fresh = load(self.dir)
        fresh.process = self.process
        return fresh

    def wait(self, poll_s: float = 5.0, timeout_s: Optional[float] = None) -> "Sweep":
        """Block until no run is queued or running (and a local launch's process has ended); the final state."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self.process is not None:
            self.process.wait(timeout=timeout_s)
        sweep = self.refresh()
        while any(r.state in ACTIVE for r in sweep.runs):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self.dir}: runs still active after {timeout_s} s")
            time.sleep(poll_s)
            sweep = sweep.refresh()
        return sweep


def _value(run: Run, metric: Optional[str], objective_metric: Optional[str]) -> Optional[float]:
    raw = run.objective if metric is None or metric == objective_metric else run.metrics.get(metric)
    if raw is None and metric == objective_metric and metric is not None:
        raw = run.metrics.get(metric)
    try:
        return None if raw is None else float(raw)
    except (TypeError, ValueError):
        return None


def _row(r: Run) -> Dict[str, Any]:
    row: Dict[str, Any] = {"index": r.idx, "name": r.name, **r.params, "state": r.state.value,
                           "objective": r.objective}
    row.update({k: v for k, v in r.metrics.items() if k not in row})
    c = r.cost
    row.update(restarts=r.restarts, step=r.step, gpu_hours=c.gpu_hours if c else None,
               cpu_hours=c.cpu_hours if c else None, wall_s=c.wall_s if c else None,
               estimated=c.estimated if c else None, requeues=c.requeues if c else None,
               redone_steps=c.redone_steps if c else None, redone_gpu_hours=c.redone_gpu_hours if c else None,
               run_dir=str(r.run_dir) if r.run_dir else None)
    hw = r.hardware  # what its latest attempt ran on (None where not recorded)
    row.update(gpu_model=hw.get("gpu_model"), gpu_count=hw.get("gpu_count"), driver=hw.get("driver"),
               cuda=hw.get("cuda"), cuda_driver=hw.get("cuda_driver"), cpu_model=hw.get("cpu_model"),
               nodes=",".join(ran_on.nodes(hw)) or None, straggler=r.straggler or None)
    return row


@contextmanager
def quiet_gc() -> Iterator[None]:
    """The cyclic garbage collector paused while a sweep is read: 10,000 runs' rows are about a million
    objects that all live on, and each full collection walks every one of them (0.12-0.22 s of a 0.75-0.87 s
    read of 10,000 runs measured, 0.12 s of the manifest's 0.26 s). Reference counting still frees what the
    read drops; the collector is on again afterwards (if it was)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load(path: Optional[PathLike] = None) -> Sweep:
    """The sweep in ``path`` (default: the newest under ./multirun). Raises only when there is no sweep there."""
    with quiet_gc():
        return read(load_sweep(find_sweep_dir(str(path) if path is not None else None)))


def read(listing: SweepListing, poller: Any = None) -> Sweep:
    """The runs of a sweep whose manifest is read (``review.sweep.load_sweep``): the one reader of a sweep's
    runs for the API, ``status``, ``report`` and the tab. ``poller``: ``status --watch``'s squeue poller."""
    with quiet_gc():
        snap = collect(listing, poller)
    declared = snap.objective() or {}
    metric = listing.objective_metric or declared.get("metric") or snap.metric  # report's choice when none is declared
    mode = declared.get("mode") if declared.get("metric") == metric else None
    return Sweep(dir=listing.dir, launcher=listing.launcher, runs=snap.runs, swept=list(listing.swept),
                 objective_metric=metric,
                 direction=Direction.parse(mode) if mode else default_mode(metric or "train/loss", snap.runs),
                 problems=list(snap.warnings), dead_workers=list(snap.dead_workers), listing=listing, taken=snap.taken)
