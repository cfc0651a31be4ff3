"""What a rerun of a sweep submits: the runs neither completed by the same code nor still queued or running.

A run whose recorded job (sweep.json) is still in the queue is left alone: submitting it again would put
two jobs on one run dir. When the queue cannot be asked, a run with a recorded job is not submitted
either (unknown is never "gone"), and the launcher says so.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set, Tuple

from hpctrain.core import events, manifest
from hpctrain.submit.plan import Run

InQueue = Callable[[List[str]], Optional[Set[str]]]  # the job ids still queued or running; None: unknown


@dataclass
class Rerun:
    todo: List[Run] = field(default_factory=list)
    completed: List[Run] = field(default_factory=list)
    active: List[Tuple[Run, str]] = field(default_factory=list)  # (run, its job id in the queue)
    unknown: List[Tuple[Run, str]] = field(default_factory=list)  # (run, its job id): the queue did not answer

    def lines(self) -> List[str]:
        """What is left alone, one line each."""
        out = [f"  skip {r.name}: already completed" for r in self.completed]
        if self.active:
            out.append(f"hpctrain: {len(self.active)} run(s) left alone, still queued or running: "
                       + _listed(self.active))
        if self.unknown:
            out.append(f"hpctrain: {len(self.unknown)} run(s) not submitted again: the queue did not answer whether "
                       f"their jobs are still queued or running ({_listed(self.unknown)}); run the same command again "
                       f"once squeue answers")
        return out


def sort(runs: List[Run], app: str, sweep_dir: Path, in_queue: InQueue) -> Rerun:
    """``runs`` sorted into what to submit and what is left alone (completed, queued or running, unknown)."""
    out = Rerun()
    recorded = recorded_jobs(sweep_dir)
    waiting: List[Tuple[Run, str]] = []
    for run in runs:
        if events.is_completed(run.run_dir, app):
            out.completed.append(run)
        elif recorded.get(_key(run.run_dir)):
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


def recorded_jobs(sweep_dir: Path) -> Dict[str, str]:
    """Each run dir's last recorded job id (sweep.json), by resolved path."""
    m = manifest.read(sweep_dir)
    if m is None:
        return {}
    return {_key(e.spec.run_dir): e.job_id for e in m.runs.values() if e.job_id}


def _key(run_dir: "str | Path") -> str:
    return str(Path(run_dir).absolute())


def _listed(pairs: List[Tuple[Run, str]], most: int = 8) -> str:
    names = [f"{r.name} (job {job})" for r, job in pairs[:most]]
    return ", ".join(names) + (f" and {len(pairs) - most} more" if len(pairs) > most else "")
