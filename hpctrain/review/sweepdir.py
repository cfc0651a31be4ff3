"""Which sweep, and which runs it should hold: the launcher's manifest (``sweep.json``) first.

A sweep still in flight on the local launcher has no manifest yet; then the runs come from Hydra's
``multirun.yaml`` and the run dirs already there (:mod:`hpctrain.review.discover`).
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpctrain import runfiles
from hpctrain.search import review as search_review

MULTIRUN_YAML = "multirun.yaml"


class SweepError(Exception):
    """A sweep dir that is missing or is not one; the message names the path and what was expected."""


@dataclass
class RunSpec:
    idx: int
    name: str
    run_dir: Optional[Path]  # absolute; None while not known (a pending run of an in-flight local sweep)
    overrides: List[str]
    job_id: Optional[str]
    max_steps: Optional[int] = None


@dataclass
class Sweep:
    dir: Path
    launcher: str  # "local" | "slurm" | "unknown"
    submitit_folder: Path
    runs: List[RunSpec]
    has_manifest: bool = True
    launcher_pid: Optional[int] = None  # the local launcher's process, as its manifest records it
    swept: List[str] = field(default_factory=list)  # override keys whose values differ between runs
    search: Optional[Dict[str, Any]] = None  # a search sweep's settings (sweep.json "search"); runs are trials

    @property
    def objective_metric(self) -> Optional[str]:
        return (self.search or {}).get("metric") or ("value" if self.search else None)

    def values(self, run: RunSpec) -> Dict[str, str]:
        """The run's swept values, ``{"lr": "0.001"}``."""
        parsed = parse_overrides(run.overrides)
        return {k: parsed[k] for k in self.swept if k in parsed}

    def label(self, run: RunSpec, sep: str = " ") -> str:
        return sep.join(f"{k}={v}" for k, v in self.values(run).items()) or "(defaults)"


def parse_overrides(overrides: List[str]) -> Dict[str, str]:
    """``["+a.b=1", "lr=0.1"]`` -> ``{"a.b": "1", "lr": "0.1"}`` (deletions ``~key`` are skipped)."""
    out = {}
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and not key.startswith("~"):
            out[key.lstrip("+")] = value
    return out


def swept_keys(runs: List[RunSpec]) -> List[str]:
    """Keys whose value is not the same in every run; with one run, all of its override keys."""
    parsed = [parse_overrides(r.overrides) for r in runs]
    keys: List[str] = []
    for p in parsed:
        keys += [k for k in p if k not in keys]
    if len(runs) <= 1:
        return keys
    return [k for k in keys if len({p.get(k) for p in parsed}) > 1]


def is_sweep_dir(path: Path) -> bool:
    return (path / runfiles.SWEEP_MANIFEST).is_file() or (path / MULTIRUN_YAML).is_file()


def find_sweep_dir(arg: Optional[str], root: Path = Path("multirun")) -> Path:
    """The given sweep dir, checked; else the newest sweep under ``./multirun``."""
    if arg:
        path = Path(arg).expanduser()
        if not path.is_dir():
            raise SweepError(f"{path}: no such directory (expected a sweep dir holding sweep.json or multirun.yaml)")
        if not is_sweep_dir(path):
            if is_sweep_dir(path.parent):
                raise SweepError(f"{path}: is one run of the sweep {path.parent}; pass the sweep dir")
            raise SweepError(f"{path}: not a sweep dir (expected sweep.json or multirun.yaml in it)")
        return path.absolute()
    candidates = []
    for depth in ("*", "*/*", "*/*/*"):
        for name in (runfiles.SWEEP_MANIFEST, MULTIRUN_YAML):
            candidates += root.glob(f"{depth}/{name}")
    if not candidates:
        raise SweepError(f"{root.absolute()}: no sweep found (expected <sweep_dir>/multirun.yaml or sweep.json "
                         f"under it); pass SWEEP_DIR")
    newest = max(candidates, key=lambda p: p.stat().st_mtime)
    return newest.parent.absolute()


def load_sweep(sweep_dir: Path) -> Sweep:
    manifest = runfiles.read_manifest(sweep_dir)
    if manifest is None or not manifest.get("runs"):
        from hpctrain.review.discover import discover_sweep

        sweep = discover_sweep(sweep_dir)
    else:
        sweep = _from_manifest(sweep_dir, manifest)
    sweep.swept = swept_keys(sweep.runs)
    return sweep


def _from_manifest(sweep_dir: Path, manifest: Dict) -> Sweep:
    runs = []
    for key, r in manifest["runs"].items():
        run_dir = r.get("run_dir")
        runs.append(RunSpec(
            idx=int(key),
            name=str(r.get("name") or run_dir or key),
            run_dir=(sweep_dir / run_dir) if run_dir else None,
            overrides=list(r.get("overrides") or []),
            job_id=str(r["job_id"]) if r.get("job_id") is not None else None,
            max_steps=r.get("max_steps"),
        ))
    runs.sort(key=lambda r: r.idx)
    folder = Path(manifest.get("submitit_folder") or sweep_dir / runfiles.SUBMITIT_DIR)
    if not folder.is_absolute():
        folder = sweep_dir / folder
    if not folder.is_dir() and (sweep_dir / runfiles.SUBMITIT_DIR).is_dir():
        folder = sweep_dir / runfiles.SUBMITIT_DIR  # the sweep dir was moved or copied
    return Sweep(dir=sweep_dir, launcher=str(manifest.get("launcher") or "unknown"), submitit_folder=folder,
                 runs=runs, has_manifest=True, launcher_pid=manifest.get("launcher_pid"),
                 search=search_review.settings(manifest))
