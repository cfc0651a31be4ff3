"""The Python face over sweeps: ``hpctrain.load(dir)``, ``hpctrain.launch([...])``, ``hpctrain.compare([...])``.

Login side: no torch. Reads through the review layer's single readers (the manifest, the run record,
metrics.json, the queue, accounting); whatever cannot be read is said in ``Sweep.problems``, never raised.

    import hpctrain
    sweep = hpctrain.load("multirun/2026-12-01/10-00-00")
    sweep.best(), sweep.to_pandas(), sweep.curves("val/loss"), sweep.gpu_hours()
"""

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from hpctrain.core.state import ACTIVE, Direction, State
from hpctrain.review import cost as costs
from hpctrain.review.ranking import typed_value
from hpctrain.review.sweep import SweepError, find_sweep_dir

PathLike = Union[str, Path]
Curve = List[Tuple[int, float]]


@dataclass(frozen=True)
class Run:
    """One run of a sweep, as review sees it now."""

    index: int
    name: str
    params: Dict[str, Any]  # the swept values, as numbers where they are numbers
    state: State
    objective: Optional[float]  # the value of the sweep's objective metric, where the run has it
    metrics: Dict[str, Any]  # the final (or latest) metrics of metrics.json
    step: Optional[int]
    max_steps: Optional[int]
    restarts: int
    cost: Optional[costs.Cost]
    utilisation: Dict[str, float]  # metrics.json's "sys" means and peaks, where the job sampled them
    run_dir: Optional[Path]
    job_id: Optional[str]
    error: Optional[str] = None
    note: str = ""
    log: Optional[str] = None

    @property
    def gpu_hours(self) -> Optional[float]:
        return self.cost.gpu_hours if self.cost else None


@dataclass
class Sweep:
    dir: Path
    launcher: str
    runs: List[Run]
    swept: List[str]
    objective_metric: Optional[str]
    direction: Direction
    problems: List[str] = field(default_factory=list)  # what could not be read, one line each
    process: Optional[subprocess.Popen] = field(default=None, repr=False)  # hpctrain.launch(..., local)

    def best(self) -> Optional[Run]:
        scored = [r for r in self.runs if r.objective is not None]
        if not scored:
            return None
        pick = min if self.direction is Direction.MIN else max
        return pick(scored, key=lambda r: r.objective)

    def gpu_hours(self, state: Optional[State] = None) -> float:
        """GPU-hours of every run, or of the runs that ended ``state`` (completed, failed, cancelled, ...)."""
        return sum(r.cost.gpu_hours for r in self.runs if r.cost and (state is None or r.state is state))

    def cost_by_state(self) -> Dict[State, float]:
        out: Dict[State, float] = {}
        for r in self.runs:
            if r.cost:
                out[r.state] = out.get(r.state, 0.0) + r.cost.gpu_hours
        return out

    def to_pandas(self) -> Any:
        """One row per run: index, name, a column per swept key and per metric, state, objective, restarts,
        gpu_hours, cpu_hours, wall_s, estimated, step, run_dir."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Sweep.to_pandas() needs pandas: pip install 'hpctrain[pandas]' (or pandas)") from None
        return pd.DataFrame([_row(r) for r in self.runs])

    def curves(self, tag: str) -> Dict[str, Curve]:
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


def _row(r: Run) -> Dict[str, Any]:
    row: Dict[str, Any] = {"index": r.index, "name": r.name, **r.params, "state": r.state.value,
                           "objective": r.objective}
    row.update({k: v for k, v in r.metrics.items() if k not in row})
    c = r.cost
    row.update(restarts=r.restarts, step=r.step, gpu_hours=c.gpu_hours if c else None,
               cpu_hours=c.cpu_hours if c else None, wall_s=c.wall_s if c else None,
               estimated=c.estimated if c else None, run_dir=str(r.run_dir) if r.run_dir else None)
    return row


def load(path: Optional[PathLike] = None) -> Sweep:
    """The sweep in ``path`` (default: the newest under ./multirun). Raises only when there is no sweep there."""
    from hpctrain.review.runs import collect
    from hpctrain.review.sweep import load_sweep

    sweep_dir = find_sweep_dir(str(path) if path is not None else None)
    spec = load_sweep(sweep_dir)
    snap = collect(spec)
    problems = list(snap.warnings)
    declared = snap.objective() or {}
    metric = spec.objective_metric or declared.get("metric")
    direction = Direction.parse(declared.get("mode") or "min")
    cost_of, cost_problems = costs.for_rows(sweep_dir, spec.launcher, snap.runs)
    problems += cost_problems
    runs = []
    for r in snap.runs:
        value = r.metrics.get(metric) if metric else None
        runs.append(Run(
            index=r.idx, name=r.name, params={k: typed_value(v) for k, v in r.values.items()}, state=r.state,
            objective=float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None,
            metrics=dict(r.metrics), step=r.step, max_steps=r.max_steps, restarts=r.restarts,
            cost=cost_of.get(r.idx), utilisation=dict(r.sys), run_dir=Path(r.run_dir) if r.run_dir else None,
            job_id=r.job_id, error=r.error, note=r.note, log=r.log))
    return Sweep(dir=sweep_dir, launcher=spec.launcher, runs=runs, swept=list(spec.swept), objective_metric=metric,
                 direction=direction, problems=problems)


def compare(paths: Sequence[PathLike]) -> Any:
    """One table (pandas) of the runs of several sweeps, a ``sweep`` column first."""
    frames = []
    for path in paths:
        frame = load(path).to_pandas()
        frame.insert(0, "sweep", str(path))
        frames.append(frame)
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def launch(overrides: Sequence[str], launcher: Optional[str] = None, sweep_dir: Optional[PathLike] = None,
           app: Sequence[str] = ("-m", "hpctrain"), cwd: Optional[PathLike] = None) -> Sweep:
    """Submit a sweep as ``python -m hpctrain -m OVERRIDES`` would, and return it without waiting (``.wait()``).

    ``launcher``: "slurm", "local", or None (Slurm when sbatch is on PATH). On Slurm the call returns once the
    sweep is queued; the local launcher runs in a child process the returned Sweep holds. Bad input raises
    ``SweepError`` with the launcher's own one-line message; nothing is submitted then.
    """
    where = Path(cwd or os.getcwd())
    target = Path(sweep_dir) if sweep_dir else Path("multirun", time.strftime("%Y-%m-%d"), time.strftime("%H-%M-%S"))
    target = target if target.is_absolute() else where / target
    argv = [sys.executable, *app, "-m", *overrides, f"hydra.sweep.dir={target}"]
    if launcher:
        argv.append(f"hydra/launcher={launcher}")
    if launcher == "local" or (launcher is None and not _has_sbatch()):
        log_path = target / ".hpctrain" / "launch.log"  # the launcher's own output
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, cwd=where, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not (target / "sweep.json").exists():  # planned and checked: the manifest is written first
            if proc.poll() is not None:
                raise SweepError(_first_error(log_path.read_text(), argv))
            if time.monotonic() > deadline:
                raise SweepError(f"{target}: no sweep.json within 120 s of `{shlex.join(argv)}`")
            time.sleep(0.2)
        sweep = load(target)
        sweep.process = proc
        return sweep
    done = subprocess.run(argv, cwd=where, capture_output=True, text=True)
    if done.returncode != 0:
        raise SweepError(_first_error(done.stderr, argv))
    return load(target)


def _has_sbatch() -> bool:
    import shutil

    return shutil.which("sbatch") is not None


def _first_error(text: str, argv: Sequence[str]) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("hpctrain: launcher ")]
    return "\n".join(lines[:20]) if lines else f"`{shlex.join(argv)}` failed"
