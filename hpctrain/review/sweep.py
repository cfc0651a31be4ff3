"""Which sweep, and which runs it should hold: the launcher's manifest (``sweep.json``) first.

A sweep still in flight on the local launcher has no manifest yet; then the runs come from Hydra's
``multirun.yaml`` (the basic sweeper's own expansion of the sweep) and the run dirs already there,
matched by their ``.hydra/overrides.yaml``.
"""

import functools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from hpctrain.core import events, manifest, safefs
from hpctrain.core.paths import MULTIRUN_YAML, SWEEP_MANIFEST, RunPaths, SweepPaths
from hpctrain.core.redact import is_secret_key, redact_override
from hpctrain.review import search as search_review
from hpctrain.slurm.parse import job_order


FUTURE_SLACK_S = 60.0  # clocks of login nodes and shared file systems differ by seconds, not by this


class SweepError(Exception):
    """A sweep dir that is missing or is not one; the message names the path and what was expected."""


@dataclass
class ListedRun:
    idx: int
    name: str
    run_dir: Optional[Path]  # absolute; None while not known (a pending run of an in-flight local sweep)
    overrides: List[str]
    job_id: Optional[str]
    max_steps: Optional[int] = None


@dataclass
class SweepListing:
    dir: Path
    launcher: str  # "local" | "slurm" | "unknown"
    submitit_folder: Path
    runs: List[ListedRun]
    has_manifest: bool = True
    launcher_pid: Optional[int] = None  # the local launcher's process, as its manifest records it
    swept: List[str] = field(default_factory=list)  # override keys whose values differ between runs
    search: Optional[Dict[str, Any]] = None  # a search sweep's settings (sweep.json "search"); runs are trials
    worker_job_ids: List[str] = field(default_factory=list)  # a search's worker tasks, in worker order

    @property
    def objective_metric(self) -> Optional[str]:
        """A search sweep's objective: its metric, or ``value`` (the task function's return value)."""
        return (self.search or {}).get("metric") or ("value" if self.search else None)

    def values(self, run: ListedRun) -> Dict[str, str]:
        """The run's swept values, ``{"lr": "0.001"}``."""
        parsed = parse_overrides(run.overrides)
        return {k: parsed[k] for k in self.swept if k in parsed}


def parse_overrides(overrides: List[str]) -> Dict[str, str]:
    """``["+a.b=1", "lr=0.1"]`` -> ``{"a.b": "1", "lr": "0.1"}`` (deletions ``~key`` are skipped)."""
    out = {}
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and not key.startswith("~"):
            out[key.lstrip("+")] = value
    return out


@functools.lru_cache(maxsize=65536)  # sweeps repeat their values: each distinct one cast once
def typed_value(value: str) -> Any:
    """A swept value as the number it reads as (``"1e-3"`` -> 0.001), else the text."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def swept_keys(runs: List[ListedRun]) -> List[str]:
    """Keys whose value is not the same in every run; with one run, all of its override keys."""
    parsed = [parse_overrides(r.overrides) for r in runs]
    keys: List[str] = []
    for p in parsed:
        keys += [k for k in p if k not in keys]
    if len(runs) <= 1:
        return keys
    return [k for k in keys if len({p.get(k) for p in parsed}) > 1]


def is_sweep_dir(path: Path) -> bool:
    paths = SweepPaths(path)
    return paths.manifest.is_file() or paths.multirun_yaml.is_file()


def find_sweep_dir(arg: Optional[str], root: Path = Path("multirun")) -> Path:
    """The given sweep dir, checked; else the newest sweep under ``./multirun`` (its manifest's mtime)."""
    if arg:
        path = Path(arg).expanduser()
        if not path.is_dir():
            raise SweepError(f"{path}: no such directory (expected a sweep dir holding sweep.json or multirun.yaml)")
        if not is_sweep_dir(path):
            if is_sweep_dir(path.parent):
                raise SweepError(f"{path}: is one run of the sweep {path.parent}; pass the sweep dir")
            raise SweepError(f"{path}: not a sweep dir (expected sweep.json or multirun.yaml in it)")
        return path.absolute()
    candidates: List[Path] = []
    for depth in ("*", "*/*", "*/*/*"):
        for name in (SWEEP_MANIFEST, MULTIRUN_YAML):
            candidates += root.glob(f"{depth}/{name}")
    if not candidates:
        raise SweepError(f"{root.absolute()}: no sweep found (expected <sweep_dir>/multirun.yaml or sweep.json "
                         f"under it); pass SWEEP_DIR")
    now = time.time()

    def age(path: Path) -> Tuple[bool, float, Tuple[str, ...]]:
        # a file dated in the future (a clock ahead, a copy that kept its times) says nothing of when the
        # sweep was made: it ranks below every sane one, by name (Hydra's multirun/DATE/TIME) among those
        mtime = path.stat().st_mtime
        sane = mtime <= now + FUTURE_SLACK_S
        return sane, mtime if sane else 0.0, path.parent.relative_to(root).parts

    return max(candidates, key=age).parent.absolute()


def load_sweep(sweep_dir: Path) -> SweepListing:
    found = manifest.read(sweep_dir)
    if found is not None and not found.runs and found.search is not None:
        sweep = _from_manifest(sweep_dir, found)  # a search before its first trial: its workers say why
    elif found is None or not found.runs:
        sweep = discover_sweep(sweep_dir)
    else:
        sweep = _from_manifest(sweep_dir, found)
    redacted: Dict[str, str] = {}  # runs share most overrides: each distinct one redacted once
    for run in sweep.runs:  # matched to their run dirs already: from here on, only shown to people
        run.overrides = [redacted.get(o) or redacted.setdefault(o, redact_override(o)) for o in map(str, run.overrides)]
    sweep.swept = [k for k in swept_keys(sweep.runs) if not is_secret_key(k)]  # no column of <redacted>
    return sweep


def _from_manifest(sweep_dir: Path, found: manifest.Manifest) -> SweepListing:
    runs = [ListedRun(idx=e.idx, name=e.name, run_dir=e.spec.run_dir, overrides=list(e.spec.overrides),
                    job_id=e.job_id, max_steps=e.spec.max_steps)
            for e in sorted(found.runs.values(), key=lambda e: e.idx)]
    default = SweepPaths(sweep_dir).submitit
    folder = Path(found.submitit_folder or default)
    if not folder.is_absolute():
        folder = sweep_dir / folder
    if not folder.is_dir() and default.is_dir():
        folder = default  # the sweep dir was moved or copied
    return SweepListing(dir=sweep_dir, launcher=str(found.launcher or "unknown"), submitit_folder=folder,
                 runs=runs, has_manifest=True, launcher_pid=found.launcher_pid,
                 search=search_review.settings(found), worker_job_ids=_worker_job_ids(found))


def _worker_job_ids(found: manifest.Manifest) -> List[str]:
    """The latest submission's search workers (``123_0``, ``123_1``, ...; local pids), in worker order."""
    for sub in reversed(found.submissions):
        ids = [str(j) for j in sub.extra.get("worker_job_ids") or []]
        if ids:
            return sorted(ids, key=job_order)
    return []


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(path: Path) -> Any:
    try:
        with open(safefs.open_read(path)) as f:  # a planted link is not followed
            return yaml.load(f, Loader=_Loader)
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8
        return None


def expected_runs(hydra_cfg: Dict[str, Any]) -> Optional[List[List[str]]]:
    """Every sweep point's overrides in job order, as Hydra's basic sweeper makes them; None if unknown."""
    sweeper = hydra_cfg.get("sweeper") or {}
    if "BasicSweeper" not in str(sweeper.get("_target_", "BasicSweeper")):
        return None
    task = list((hydra_cfg.get("overrides") or {}).get("task") or [])
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from hpctrain._compat.hydra import BasicSweeper

        parsed = OverridesParser.create().parse_overrides(params + task)
        batches = BasicSweeper.split_arguments(parsed, None)
    except Exception:  # noqa: BLE001 - an unreadable sweep only means: no pending runs shown
        return None
    return [list(run) for batch in batches for run in batch]


def _run_dirs(sweep_dir: Path) -> List[Tuple[Path, List[str]]]:
    out = []
    for path in sorted(sweep_dir.iterdir()):
        overrides = RunPaths(path).overrides_yaml
        if not path.name.startswith(".") and overrides.is_file():
            out.append((path, [str(o) for o in (_load_yaml(overrides) or [])]))
    return out


def _index_of(path: Path) -> Optional[int]:
    m = re.match(r"(\d+)(_|$)", path.name)
    if m:
        return int(m.group(1))
    hydra = _load_yaml(RunPaths(path).hydra_yaml) or {}
    num = ((hydra.get("hydra") or {}).get("job") or {}).get("num")
    return int(num) if num is not None else None


def discover_sweep(sweep_dir: Path) -> SweepListing:
    cfg = _load_yaml(SweepPaths(sweep_dir).multirun_yaml)
    if not isinstance(cfg, dict) or "hydra" not in cfg:
        raise SweepError(f"{sweep_dir}: neither a launcher manifest ({SWEEP_MANIFEST}) nor a readable "
                         f"{MULTIRUN_YAML}")
    hydra = cfg["hydra"]
    expected = expected_runs(hydra) or []
    by_overrides = {tuple(o): i for i, o in enumerate(expected)}
    specs: Dict[int, ListedRun] = {}
    for path, overrides in _run_dirs(sweep_dir):
        idx = by_overrides.get(tuple(overrides))
        if idx is None:
            idx = _index_of(path)
        if idx is None or idx in specs:
            continue
        specs[idx] = ListedRun(idx, path.name, path, overrides, None)
    for idx, overrides in enumerate(expected):
        specs.setdefault(idx, ListedRun(idx, f"{idx} (not started)", None, overrides, None))
    default_steps = cfg.get("max_steps")
    for spec in specs.values():
        job_id = events.read(spec.run_dir).job_id
        spec.job_id = str(job_id) if job_id else None
        steps = dict(o.split("=", 1) for o in spec.overrides if o.startswith("max_steps="))
        spec.max_steps = _int(steps.get("max_steps", default_steps))
    launcher = hydra.get("launcher") or {}
    target = str(launcher.get("_target_", ""))
    kind = "slurm" if "slurm" in target.lower() else "local" if "local" in target.lower() else "unknown"
    folder = str(launcher.get("submitit_folder") or "${hydra.sweep.dir}/.submitit")
    folder = folder.replace("${hydra.sweep.dir}", str(sweep_dir))
    return SweepListing(dir=sweep_dir, launcher=kind, submitit_folder=Path(folder),
                 runs=[specs[i] for i in sorted(specs)], has_manifest=False)


def _int(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
