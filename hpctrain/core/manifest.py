"""sweep.json, the launcher's manifest of a sweep, as dataclasses; one locked update for every writer.

Written by the launcher (each submission, then its job ids), the search sweeper and its workers (one
entry per trial); read by review. Every write goes through :func:`update` (an exclusive lock on
:attr:`SweepPaths.manifest_lock`, read, apply, temp-file-and-rename), so two writers never lose each
other's entries. A run entry is :meth:`RunSpec.to_json` plus its ``job_id`` (and whatever else a
writer adds, e.g. a trial's ``trial`` and ``params``). Manifests written by older versions read too:
their entries, keyed by ``str(idx)``, carry ``name`` but no ``idx``. Keys this module does not know are
kept as they are. No torch, no Hydra.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from hpctrain.core.atomic import locked, read_json, write_json_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.core.redact import redact_overrides
from hpctrain.core.run import RunSpec

PathLike = Union[str, Path]
_SPEC_KEYS = {"idx", "overrides", "run_dir", "max_steps"}
_ENTRY_KEYS = _SPEC_KEYS | {"job_id", "name"}  # "name": written by older versions, the run dir's name


@dataclass
class RunEntry:
    spec: RunSpec
    job_id: Optional[str] = None  # filled in once the job exists
    extra: Dict[str, Any] = field(default_factory=dict)  # a search trial's "trial" and "params", ...

    @property
    def idx(self) -> int:
        return self.spec.idx

    @property
    def name(self) -> str:
        return self.spec.name

    def to_json(self, sweep_dir: PathLike) -> Dict[str, Any]:
        spec = self.spec.to_json(Path(sweep_dir))
        spec["overrides"] = redact_overrides(spec["overrides"])  # read by people; the job is handed its own
        return {**self.extra, **spec, "job_id": self.job_id}

    @classmethod
    def from_json(cls, key: str, data: Dict[str, Any], sweep_dir: PathLike) -> Optional["RunEntry"]:
        """One entry; None when it names no run dir (nothing to read for it)."""
        run_dir = data.get("run_dir") or data.get("name")
        if not run_dir:
            return None
        spec = RunSpec.from_json({**data, "idx": data.get("idx", key), "run_dir": run_dir}, Path(sweep_dir))
        job_id = data.get("job_id")
        return cls(spec, str(job_id) if job_id is not None else None,
                   {k: v for k, v in data.items() if k not in _ENTRY_KEYS})


@dataclass
class SubmissionRecord:
    time: float = field(default_factory=time.time)
    job_ids: List[str] = field(default_factory=list)  # the Slurm job (array) ids, or the local pids
    runs: List[int] = field(default_factory=list)  # the runs this submission started
    launcher_pid: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict)  # a search's "workers", "worker_job_ids"

    def to_json(self) -> Dict[str, Any]:
        return {**self.extra, "time": self.time, "job_ids": list(self.job_ids), "runs": list(self.runs),
                "launcher_pid": self.launcher_pid}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "SubmissionRecord":
        known = {"time", "job_ids", "runs", "launcher_pid"}
        return cls(time=float(data.get("time") or 0.0), job_ids=[str(j) for j in data.get("job_ids") or []],
                   runs=[int(i) for i in data.get("runs") or []], launcher_pid=data.get("launcher_pid"),
                   extra={k: v for k, v in data.items() if k not in known})


@dataclass
class Manifest:
    launcher: Optional[str] = None  # "local" | "slurm"
    app: Optional[str] = None  # the task function's module, or a script's path
    submitit_folder: Optional[str] = None
    launcher_pid: Optional[int] = None  # the last launching process (a local sweep's launcher)
    search: Optional[Dict[str, Any]] = None  # a search sweep's settings; its runs are trials
    submissions: List[SubmissionRecord] = field(default_factory=list)
    runs: Dict[int, RunEntry] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_json(self, sweep_dir: PathLike) -> Dict[str, Any]:
        out: Dict[str, Any] = {**self.extra, "launcher": self.launcher, "app": self.app,
                               "submitit_folder": self.submitit_folder, "launcher_pid": self.launcher_pid,
                               "submissions": [s.to_json() for s in self.submissions],
                               "runs": {str(i): self.runs[i].to_json(sweep_dir) for i in sorted(self.runs)}}
        if self.search is not None:
            out["search"] = self.search
        return out

    @classmethod
    def from_json(cls, data: Dict[str, Any], sweep_dir: PathLike) -> "Manifest":
        known = {"launcher", "app", "submitit_folder", "launcher_pid", "search", "submissions", "runs"}
        runs: Dict[int, RunEntry] = {}
        raw_runs: Dict[str, Any] = data["runs"] if isinstance(data.get("runs"), dict) else {}
        for key, entry in raw_runs.items():
            try:
                parsed = RunEntry.from_json(str(key), entry, sweep_dir) if isinstance(entry, dict) else None
            except (TypeError, ValueError):
                parsed = None  # an entry that does not read: the others stand
            if parsed is not None:
                runs[parsed.idx] = parsed
        search = data.get("search")
        return cls(launcher=data.get("launcher"), app=data.get("app"), submitit_folder=data.get("submitit_folder"),
                   launcher_pid=data.get("launcher_pid"), search=search if isinstance(search, dict) else None,
                   submissions=[SubmissionRecord.from_json(s) for s in data.get("submissions") or [] if isinstance(s, dict)],
                   runs=runs, extra={k: v for k, v in data.items() if k not in known})

    def last_submission(self) -> SubmissionRecord:
        if not self.submissions:
            self.submissions.append(SubmissionRecord())
        return self.submissions[-1]


def read(sweep_dir: PathLike) -> Optional[Manifest]:
    """The sweep's manifest, or None when it has none (or it does not read)."""
    data = read_json(SweepPaths(sweep_dir).manifest)
    return Manifest.from_json(data, sweep_dir) if data is not None else None


def update(sweep_dir: PathLike, fn: Callable[[Manifest], None]) -> Manifest:
    """The one writer: lock, read (or start an empty manifest), ``fn(manifest)`` changes it, atomic write."""
    paths = SweepPaths(sweep_dir)
    with locked(paths.manifest_lock):
        manifest = read(sweep_dir) or Manifest()
        fn(manifest)
        write_json_atomic(paths.manifest, manifest.to_json(sweep_dir))
    return manifest
