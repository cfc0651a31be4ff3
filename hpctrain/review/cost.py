"""What each run of a sweep cost: GPU-hours, CPU-hours and wall time over all its attempts.

From accounting where it answers (``sacct -D``: every attempt, requeues and retries included; one call per
sweep, made by :class:`hpctrain.review.runs.Accounting`), else estimated from the run's own record (first start to last event) and its allocation, and marked
so. Runs packed into one task (``runs_per_task``) share its allocation evenly.
"""

import operator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpctrain.core import safefs
from hpctrain.core.paths import SweepPaths
from hpctrain.core.state import EventKind, RunState
from hpctrain.slurm.parse import Usage

_TIME = operator.attrgetter("time_ns")


@dataclass(frozen=True)
class Cost:
    gpu_hours: float
    cpu_hours: float
    wall_s: float  # summed over attempts
    attempts: int
    estimated: bool  # True: from the run's record and its allocation, not from accounting
    requeues: int = 0
    redone_steps: int = 0  # trained again after a requeue: between the last checkpoint and the signal
    redone_gpu_hours: float = 0.0  # their share of the GPU-hours (every step costs the same)
    redone_unknown: int = 0  # requeues whose record lacks the step or the checkpoint's step


@dataclass(frozen=True)
class Allocation:
    """What one task is given, per the launcher's settings (``multirun.yaml``)."""

    gpus: int = 0
    cpus: int = 1


def allocation(sweep_dir: Path) -> Allocation:
    """The per-task allocation from the sweep's saved Hydra config; nothing asked of Slurm."""
    import yaml

    try:
        with open(safefs.open_read(SweepPaths(sweep_dir).multirun_yaml)) as f:  # a planted link is not followed
            launcher = ((yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {})
                        .get("hydra", {}).get("launcher", {})) or {}
    except (OSError, ValueError, yaml.YAMLError, AttributeError):  # ValueError: not UTF-8
        return Allocation()
    nodes = _int(launcher.get("nodes"), 1) or 1
    gpus = _int(launcher.get("gpus_per_node"), 0) * nodes
    tasks = _int(launcher.get("tasks_per_node"), 0) or (gpus // nodes if gpus else 1)
    cpus = (_int(launcher.get("cpus_per_task"), 1) or 1) * tasks * nodes
    return Allocation(gpus=gpus, cpus=cpus)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def from_accounting(attempts: Sequence[Usage], shared_by: int = 1) -> Cost:
    k = max(1, shared_by)
    return Cost(gpu_hours=sum(a.gpu_hours for a in attempts) / k, cpu_hours=sum(a.cpu_hours for a in attempts) / k,
                wall_s=float(sum(a.elapsed_s for a in attempts)), attempts=len(attempts), estimated=False)


def attempt_walls(rs: RunState, now: float, running: bool, last_seen: Any = None) -> List[float]:
    """Each attempt's seconds by the record, in start order (every submission's). An attempt with no end
    event counts up to ``now`` only while the run is ``running``; else up to ``last_seen`` (metrics.json's
    last write) where that is after its start: a dead attempt's cost stops growing."""
    ordered = sorted(rs.events, key=_TIME)  # a C key: status on 10,000 runs sorts each record
    seen = last_seen * 1e9 if isinstance(last_seen, (int, float)) and not isinstance(last_seen, bool) else 0.0
    walls = []
    ended: Optional[int] = None  # the first event after this one that is not a start (one pass, from the end)
    for event in reversed(ordered):
        if event.kind is not EventKind.STARTED:
            ended = event.time_ns
            continue
        if event.rank > 0:
            continue
        end_ns = ended if ended is not None else now * 1e9 if running else max(event.time_ns, min(seen, now * 1e9))
        walls.append(max(0.0, (end_ns - event.time_ns) / 1e9))
    walls.reverse()
    return walls


def from_record(wall_s: float, attempts: int, alloc: Allocation, shared_by: int = 1) -> Optional[Cost]:
    """The estimate where accounting does not answer: wall time x the task's allocation."""
    if not attempts:
        return None
    k = max(1, shared_by)
    return Cost(gpu_hours=alloc.gpus * wall_s / 3600 / k, cpu_hours=alloc.cpus * wall_s / 3600 / k, wall_s=wall_s,
                attempts=attempts, estimated=True)


def with_redone(cost: Cost, requeue_steps: Sequence[Tuple[Optional[int], Optional[int]]],
                step: Optional[int]) -> Cost:
    """``cost`` with what its requeues redid: per requeue, the steps from the checkpoint it resumed from to
    the step it stopped at, and their share of the run's GPU-hours (``step`` steps trained, plus those twice)."""
    known = [(s, c) for s, c in requeue_steps if s is not None and c is not None]
    steps = sum(max(0, s - c) for s, c in known)
    trained = (step or 0) + steps
    return replace(cost, requeues=len(requeue_steps), redone_steps=steps, redone_unknown=len(requeue_steps) - len(known),
                   redone_gpu_hours=cost.gpu_hours * steps / trained if trained else 0.0)


def redone_line(runs: Sequence[Any]) -> Optional[str]:
    """``redone after 3 requeues: 0.12 GPU-hours (40 steps between the last checkpoint and the signal)``;
    None when no run was requeued."""
    known = [r.cost for r in runs if r.cost is not None and r.cost.requeues]
    if not known:
        return None
    n = sum(c.requeues for c in known)
    unknown = sum(c.redone_unknown for c in known)
    line = (f"redone after {n} requeue{'s' if n != 1 else ''}: {sum(c.redone_gpu_hours for c in known):.3g} GPU-hours "
            f"({sum(c.redone_steps for c in known)} steps between the last checkpoint and the signal)")
    return line + (f"; {unknown} requeue(s) without the steps in their record: not counted" if unknown else "")


LOW_GPU_UTIL = 20.0  # % busy on average: below it a run is flagged (status, report)


def total_line(runs: Sequence[Any]) -> Optional[str]:
    """``GPU-hours: 3.2 (completed 2.9, failed 0.2, cancelled 0.1), CPU-hours: 25.6; ~ estimated`` of runs
    that carry their ``cost`` (``api.Run``)."""
    known = [r for r in runs if r.cost is not None]
    if not known:
        return None
    by_state: Dict[str, float] = {}
    for r in known:
        by_state[r.state.value] = by_state.get(r.state.value, 0.0) + r.cost.gpu_hours
    gpu = sum(r.cost.gpu_hours for r in known)
    cpu = sum(r.cost.cpu_hours for r in known)
    parts = ", ".join(f"{s} {h:.3g}" for s, h in sorted(by_state.items(), key=lambda kv: -kv[1]) if h > 0)
    estimated = " (estimated from the runs' records: no accounting)" if all(r.cost.estimated for r in known) else (
        "; ~ estimated" if any(r.cost.estimated for r in known) else "")
    return f"GPU-hours: {gpu:.3g}" + (f" ({parts})" if parts else "") + f", CPU-hours: {cpu:.3g}{estimated}"


def shown(cost: Optional[Cost]) -> str:
    """A cell: ``1.25``, ``~1.25`` when estimated, ``-`` when unknown."""
    if cost is None:
        return "-"
    return ("~" if cost.estimated else "") + f"{cost.gpu_hours:.3g}"


def low_utilisation(rows: Sequence[Any]) -> List[str]:
    """One line per run whose GPUs were less than LOW_GPU_UTIL % busy on average (when the job sampled them)."""
    out = []
    for r in rows:
        util = (r.utilisation or {}).get("gpu_util_mean")
        if isinstance(util, (int, float)) and util < LOW_GPU_UTIL:
            peak = (r.utilisation or {}).get("gpu_mem_peak_gb")
            out.append(f"#{r.idx}: GPUs {util:.0f} % busy on average"
                       + (f", peak memory {peak:.1f} GB" if isinstance(peak, (int, float)) else "")
                       + ": a smaller allocation or more runs per GPU (hydra.launcher.runs_per_task) would do")
    return out
