"""What a rerun of a sweep submits: the runs neither completed by the same code nor still queued or running.

"The same code" is the task function's file and, with a snapshot, every Python file the snapshot copies
(the user's own modules): :func:`fingerprint`. A run completed by other code runs again from scratch:
its checkpoints are set aside (kept, not loaded), or the trainer would resume its final step and train nothing.

A run whose recorded job (sweep.json) is still in the queue is left alone: submitting it again would put
two jobs on one run dir. When the queue cannot be asked, a run with a recorded job is not submitted
either (unknown is never "gone"), and the launcher says so.
"""

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from hpctrain.core import events, manifest
from hpctrain.core.paths import RunPaths
from hpctrain.core.state import EventKind
from hpctrain.submit.plan import PlannedRun

CODE_MARK = "+code:"
InQueue = Callable[[List[str]], Optional[Set[str]]]  # the job ids still queued or running; None: unknown


@dataclass
class Rerun:
    todo: List[PlannedRun] = field(default_factory=list)
    completed: List[PlannedRun] = field(default_factory=list)
    active: List[Tuple[PlannedRun, str]] = field(default_factory=list)  # (run, its job id in the queue)
    unknown: List[Tuple[PlannedRun, str]] = field(default_factory=list)  # (run, its job id): the queue did not answer
    stale: List[PlannedRun] = field(default_factory=list)  # completed by other code: run again from scratch (in todo)

    def lines(self) -> List[str]:
        """What is left alone, one line each."""
        out = []
        if self.completed:  # one line, however many: a rerun of 1000 runs is not 1000 lines
            names = [r.name for r in self.completed[:8]]
            more = len(self.completed) - len(names)
            out.append(f"hpctrain: skipped {len(self.completed)} run(s), already completed by the same code: "
                       + ", ".join(names) + (f" and {more} more" if more else ""))
        if self.active:
            out.append(f"hpctrain: {len(self.active)} run(s) left alone, still queued or running: "
                       + _listed(self.active))
        if self.unknown:
            out.append(f"hpctrain: {len(self.unknown)} run(s) not submitted again: the queue did not answer whether "
                       f"their jobs are still queued or running ({_listed(self.unknown)}); run the same command again "
                       f"once squeue answers")
        return out


def sort(runs: List[PlannedRun], app: str, sweep_dir: Path, in_queue: InQueue) -> Rerun:
    """``runs`` sorted into what to submit and what is left alone (completed, queued or running, unknown)."""
    out = Rerun()
    recorded = recorded_jobs(sweep_dir)
    waiting: List[Tuple[PlannedRun, str]] = []
    for run in runs:
        fresh = not os.path.isdir(run.run_dir)  # a new run: no record or summary to read (three reads a run)
        if not fresh and completed_by(run.run_dir, app):
            out.completed.append(run)
        elif not fresh and events.is_completed(run.run_dir):
            out.stale.append(run)
            out.todo.append(run)
        elif recorded and recorded.get(_key(run.run_dir)):  # a first submission records no job: no path to resolve
            waiting.append((run, recorded[_key(run.run_dir)]))
        else:
            out.todo.append(run)
    if waiting:
        queued = in_queue(sorted({job for _, job in waiting}))
        for run, job in waiting:
            if queued is None:
                out.unknown.append((run, job))
            elif job in queued:
                out.active.append((run, job))
            else:
                out.todo.append(run)
    order = {id(r): i for i, r in enumerate(runs)}
    out.todo.sort(key=lambda r: order[id(r)])
    return out


def fingerprint(app: str, files: Iterable[str]) -> str:
    """``app`` (the task function's name and file hash) and a hash of the Python files among ``files``."""
    digest = hashlib.sha1()
    for path in sorted(f for f in files if f.endswith(".py")):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:  # gone since it was listed: the snapshot leaves it out too
            continue
        digest.update(path.encode() + b"\0" + hashlib.sha1(data).digest())
    return f"{app}{CODE_MARK}{digest.hexdigest()[:12]}"


def completed_by(run_dir: Path, app: str) -> bool:
    """Completed by the code ``app`` names; a record of an older version (no code hash) by its task file alone."""
    if events.is_completed(run_dir, app):
        return True
    done = [e for e in events.read(run_dir).events if e.kind is EventKind.COMPLETED]
    recorded = done[-1].data().get("app") if done else None
    return (isinstance(recorded, str) and CODE_MARK not in recorded and CODE_MARK in app
            and events.is_completed(run_dir, app.split(CODE_MARK)[0]))


def set_aside(run: PlannedRun) -> Optional[Path]:
    """Move a stale run's checkpoints aside (``checkpoints.before-<time>``): kept, never resumed; the new path."""
    ckpt = RunPaths(run.run_dir).checkpoints
    if not ckpt.is_dir():
        return None
    aside = ckpt.with_name(f"{ckpt.name}.before-{time.strftime('%Y%m%d-%H%M%S')}")
    ckpt.rename(aside)
    return aside


def recorded_jobs(sweep_dir: Path) -> Dict[str, str]:
    """Each run dir's last recorded job id (sweep.json), by resolved path."""
    m = manifest.read(sweep_dir)
    if m is None:
        return {}
    return {_key(e.spec.run_dir): e.job_id for e in m.runs.values() if e.job_id}


def _key(run_dir: "str | Path") -> str:
    return str(Path(run_dir).absolute())


def _listed(pairs: List[Tuple[PlannedRun, str]], most: int = 8) -> str:
    names = [f"{r.name} (job {job})" for r, job in pairs[:most]]
    return ", ".join(names) + (f" and {len(pairs) - most} more" if len(pairs) > most else "")
