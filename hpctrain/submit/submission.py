"""What a launch will submit, as one object: built before anything is written, printed by a dry run,
sent by a backend.

A :class:`Submission` holds the tasks (each one run, or a pack of runs, as :class:`RunSpec`), the arrays
they are cut into with each array's executor parameters and the script submitit writes for it, the
files the job reads (payload, run list) and the resources each task gets. ``dry_run=true`` prints
:meth:`Submission.render`; a real launch hands the same object to the backend's ``send``.
"""

import shutil
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from hpctrain.core.paths import SweepPaths
from hpctrain.core.redact import redact_overrides
from hpctrain.core.run import RunSpec

Task = Tuple[RunSpec, ...]  # one run, or the runs packed side by side in one task


class Calling(Enum):
    """How the job's callable takes its task."""

    RUN = "run"  # job(run spec JSON): hpctrain.job.wrapper.SweepJob
    PACK = "pack"  # job([run spec JSON, ...]): hpctrain.job.pack.PackJob
    POSITIONAL = "positional"  # job(idx, overrides, run_dir): a search worker
    PULL = "pull"  # job(worker): a grid's pull worker, running the submission's points (search/pull.py)


@dataclass(frozen=True)
class Files:
    """One submission's files under ``<sweep>/.hpctrain``: ``submission-N.pkl`` (the payload),
    ``submission-N.runs.json`` (the tasks' runs, read after each attempt) and ``submission-N/code``."""

    base: Path

    @classmethod
    def next_in(cls, sweep_dir: Path) -> "Files":
        """The first number no file of an earlier submission holds, finished or not: a submission that
        failed half way leaves its number taken, never a half-written code dir in the next one's way."""
        paths = SweepPaths(sweep_dir)
        return cls(paths.submission(max(paths.submission_numbers(), default=-1) + 1))

    def remove(self) -> None:
        """This submission's files, where nothing was submitted with them."""
        shutil.rmtree(self.base, ignore_errors=True)
        for path in (self.payload, self.runs):
            path.unlink(missing_ok=True)

    @property
    def payload(self) -> Path:
        return self.base.with_suffix(".pkl")

    @property
    def runs(self) -> Path:
        return self.base.with_suffix(".runs.json")

    @property
    def code_dir(self) -> Path:
        return self.base / "code"


@dataclass
class Array:
    """One job array (or the local executor's batch): tasks ``offset .. offset + size - 1``."""

    offset: int
    size: int
    parameters: Dict[str, Any]  # the executor's parameters (sbatch options, setup and teardown lines)
    script: str = ""  # the script submitit writes for it; "" where the backend writes none
    head: str = ""  # said above the script in a dry run (several arrays)


@dataclass
class Submission:
    kind: str  # the backend: "slurm" | "local"
    sweep_dir: Path
    files: Files
    python: str  # the job's python command (the container's, where there is one)
    calling: Calling
    tasks: List[Task]
    executor: Dict[str, Any] = field(default_factory=dict)  # submitit executor arguments (folder, max_num_timeout)
    arrays: List[Array] = field(default_factory=list)
    resources: Dict[str, Any] = field(default_factory=dict)  # what each task gets
    skipped: List[RunSpec] = field(default_factory=list)  # already completed: not submitted
    points: List[RunSpec] = field(default_factory=list)  # PULL: the runs the worker tasks pull

    @property
    def runs(self) -> List[RunSpec]:
        if self.calling == Calling.PULL:
            return list(self.points)
        return [spec for task in self.tasks for spec in task]

    @property
    def claims_dir(self) -> Path:
        """PULL: the points' claim files (search/points.py), this submission's own."""
        return self.files.base / "points"

    def args(self, start: int = 0, stop: "int | None" = None) -> List[List[Any]]:
        """The job's arguments for tasks ``start:stop``, one list per parameter (as ``map_array`` takes them)."""
        tasks = self.tasks[start:stop]
        if self.calling == Calling.PULL:
            return [[t[0].idx for t in tasks]]
        if self.calling == Calling.POSITIONAL:
            return [[t[0].idx for t in tasks], [list(t[0].overrides) for t in tasks], [str(t[0].run_dir) for t in tasks]]
        if self.calling == Calling.PACK:
            return [[[s.to_json(self.sweep_dir) for s in t] for t in tasks]]
        return [[t[0].to_json(self.sweep_dir) for t in tasks]]

    def runs_json(self) -> Dict[str, Any]:
        """The run list the job script reads after each attempt (:mod:`hpctrain.job.attempt_ended`)."""
        tasks = [[{**s.to_json(self.sweep_dir), "overrides": redact_overrides(s.overrides)} for s in t]
                 for t in self.tasks]
        out: Dict[str, Any] = {"sweep_dir": str(self.sweep_dir), "tasks": tasks}  # the job script reads run dirs only
        if self.calling == Calling.PULL:  # the workers' own: the overrides they run
            out["points"] = [s.to_json(self.sweep_dir) for s in self.points]
        return out

    def scripts(self) -> str:
        return "\n".join(a.head + a.script for a in self.arrays if a.script or a.head)

    def run_lines(self) -> List[str]:
        packed = f" as {len(self.tasks)} task(s)" if self.calling == Calling.PACK else ""
        if self.calling == Calling.PULL:
            packed = f" pulled by {len(self.tasks)} worker(s)"
        lines = [f"runs ({len(self.runs)} to submit{packed}, {len(self.skipped)} already completed):"]
        return lines + [f"  {r.idx:>4}  {r.run_dir}" for r in self.runs]

    def render(self) -> str:
        """What a dry run prints: the scripts as submitit writes them, then the runs."""
        return "\n".join([self.scripts()] + self.run_lines())


def tasks_of(runs: Sequence[RunSpec], per_task: int) -> List[Task]:
    """``runs`` in tasks of ``per_task`` each, in order (ceil(N / k) tasks)."""
    return [tuple(runs[i:i + per_task]) for i in range(0, len(runs), per_task)]
