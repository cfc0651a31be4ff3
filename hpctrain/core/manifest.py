"""sweep.json, the launcher's manifest of a sweep, as dataclasses; one locked update for every writer.

Written by the launcher (each submission, then its job ids), the search sweeper and its workers (one
entry per trial); read by review. Every write goes through :func:`update` (an exclusive lock on
:attr:`SweepPaths.manifest_lock`, read, apply, temp-file-and-rename), so two writers never lose each
other's entries. A run entry is :meth:`RunSpec.to_json` plus its ``job_id`` (and whatever else a
writer adds, e.g. a trial's ``trial`` and ``params``). Manifests written by older versions read too:
their entries, keyed by ``str(idx)``, carry ``name`` but no ``idx``. Keys this module does not know are
kept as they are. No torch, no Hydra.
"""

import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from hpctrain.core.atomic import locked, read_json, write_text_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.core.redact import redact_override
from hpctrain.core.run import RunSpec

PathLike = Union[str, Path]
_SPEC_KEYS = {"idx", "overrides", "run_dir", "max_steps"}
_ENTRY_KEYS = _SPEC_KEYS | {"job_id", "name"}  # "name": written by older versions, the run dir's name
# a sweep's overrides repeat (40 lr values over 10,000 points): each one redacted once
_redacted = lru_cache(maxsize=1 << 16)(redact_override)


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
        spec = self.spec.to_json(sweep_dir)
        spec["overrides"] = [_redacted(str(o)) for o in spec["overrides"]]  # read by people; the job is handed its own
        return {**self.extra, **spec, "job_id": self.job_id}

    @classmethod
    def from_json(cls, key: str, data: Dict[str, Any], sweep_dir: PathLike) -> Optional["RunEntry"]:
        """One entry; None when it names no run dir (nothing to read for it)."""
        run_dir = data.get("run_dir") or data.get("name")
        if not run_dir:
            return None
        spec = RunSpec.from_json({**data, "idx": data.get("idx", key), "run_dir": run_dir}, sweep_dir)
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
        sweep_dir = str(sweep_dir)  # once, not once a run
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
        sweep_dir = str(sweep_dir)  # once, not once a run
        runs: Dict[int, RunEntry] = {}
        found = data.get("runs")
        raw_runs: Dict[str, Any] = found if isinstance(found, dict) else {}
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
    out: List[Manifest] = []

    def typed(data: Dict[str, Any]) -> Dict[str, Any]:
        manifest = Manifest.from_json(data, sweep_dir) if data else Manifest()
        fn(manifest)
        out.append(manifest)
        return manifest.to_json(sweep_dir)

    update_json(sweep_dir, typed)
    return out[0]


def update_json(sweep_dir: PathLike, fn: Callable[[Dict[str, Any]], Dict[str, Any]]) -> None:
    """:func:`update` on the raw JSON (``{}`` for none): for a change that needs no typed view of every run."""
    paths = SweepPaths(sweep_dir)
    with locked(paths.manifest_lock):
        write_text_atomic(paths.manifest, dumps(fn(read_json(paths.manifest) or {})))


def add_job_ids(sweep_dir: PathLike, job_ids: Dict[int, str], array_ids: List[str]) -> None:
    """Each run's job id, once its job exists, and the submission's arrays (the last submission's): set in the
    raw JSON, so that recording one array's ids costs a JSON load and dump, not a parse of every run."""
    def add(data: Dict[str, Any]) -> Dict[str, Any]:
        found = data.get("runs")
        runs: Dict[str, Any] = found if isinstance(found, dict) else {}
        for idx, job_id in job_ids.items():
            runs[str(idx)]["job_id"] = job_id  # recorded before the job was sent (a KeyError otherwise, as always)
        submissions = data.setdefault("submissions", [])
        if not submissions:
            submissions.append(SubmissionRecord().to_json())
        last = submissions[-1]
        last["job_ids"] = sorted({str(j) for j in last.get("job_ids") or []} | set(array_ids))
        return data

    update_json(sweep_dir, add)


_ENCODER = json.JSONEncoder(sort_keys=True, default=str)  # one C encoder: json.dumps(**options) builds one a call


def dumps(data: Dict[str, Any]) -> str:
    """sweep.json's text: one run entry a line (people read it; ``json.dumps(indent=...)`` runs Python's
    own encoder, ~0.1 ms a run, and sweep.json is written once per submission and per array's job ids)."""
    runs = data.get("runs") or {}
    encode = _ENCODER.encode
    head = encode({k: v for k, v in data.items() if k != "runs"})
    lines = ",\n".join(f" {encode(str(k))}: {encode(v)}" for k, v in runs.items())
    return f'{head[:-1]}{", " if len(head) > 2 else ""}"runs": {{\n{lines}\n}}}}\n'

