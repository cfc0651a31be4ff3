"""The runs of a sweep without a manifest (a local sweep still in flight, or one whose launcher was stopped).

The expected runs are Hydra's own expansion of the sweep recorded in ``multirun.yaml`` (the basic
sweeper's ``split_arguments``); run dirs already there are matched to them by their
``.hydra/overrides.yaml``; job ids come from the run's events (``.hpctrain/events/<idx>.jsonl``).
"""

import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from hpctrain import runfiles
from hpctrain.review.sweepdir import MULTIRUN_YAML, RunSpec, Sweep, SweepError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(path: Path) -> Any:
    try:
        with open(path) as f:
            return yaml.load(f, Loader=_Loader)
    except (OSError, yaml.YAMLError):
        return None


def expected_runs(hydra_cfg: Dict[str, Any]) -> Optional[List[List[str]]]:
    """Every sweep point's overrides in job order, as Hydra's basic sweeper makes them; None if unknown."""
    sweeper = hydra_cfg.get("sweeper") or {}
    if "BasicSweeper" not in str(sweeper.get("_target_", "BasicSweeper")):
        return None
    task = list((hydra_cfg.get("overrides") or {}).get("task") or [])
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(params + task)
        batches = BasicSweeper.split_arguments(parsed, None)
    except Exception:  # noqa: BLE001 - an unreadable sweep only means: no pending runs shown
        return None
    return [list(run) for batch in batches for run in batch]


def _run_dirs(sweep_dir: Path) -> List[Tuple[Path, List[str]]]:
    out = []
    for path in sorted(sweep_dir.iterdir()):
        overrides = path / runfiles.HYDRA_DIR / "overrides.yaml"
        if not path.name.startswith(".") and overrides.is_file():
            out.append((path, [str(o) for o in (_load_yaml(overrides) or [])]))
    return out


def _index_of(path: Path) -> Optional[int]:
    m = re.match(r"(\d+)(_|$)", path.name)
    if m:
        return int(m.group(1))
    hydra = _load_yaml(path / runfiles.HYDRA_DIR / "hydra.yaml") or {}
    num = ((hydra.get("hydra") or {}).get("job") or {}).get("num")
    return int(num) if num is not None else None


def _last_job_id(sweep_dir: Path, idx: int) -> Optional[str]:
    starts = [e for e in runfiles.read_events(sweep_dir, idx) if e.get("event") == "start" and e.get("job_id")]
    return str(starts[-1]["job_id"]) if starts else None


def discover_sweep(sweep_dir: Path) -> Sweep:
    cfg = _load_yaml(sweep_dir / MULTIRUN_YAML)
    if not isinstance(cfg, dict) or "hydra" not in cfg:
        raise SweepError(f"{sweep_dir}: neither a launcher manifest ({runfiles.SWEEP_MANIFEST}) nor a readable "
                         f"{MULTIRUN_YAML}")
    hydra = cfg["hydra"]
    expected = expected_runs(hydra) or []
    by_overrides = {tuple(o): i for i, o in enumerate(expected)}
    specs: Dict[int, RunSpec] = {}
    for path, overrides in _run_dirs(sweep_dir):
        idx = by_overrides.get(tuple(overrides))
        if idx is None:
            idx = _index_of(path)
        if idx is None or idx in specs:
            continue
        specs[idx] = RunSpec(idx, path.name, path, overrides, None)
    for idx, overrides in enumerate(expected):
        specs.setdefault(idx, RunSpec(idx, f"{idx} (not started)", None, overrides, None))
    default_steps = cfg.get("max_steps")
    for spec in specs.values():
        spec.job_id = _last_job_id(sweep_dir, spec.idx)
        steps = dict(o.split("=", 1) for o in spec.overrides if o.startswith("max_steps="))
        spec.max_steps = _int(steps.get("max_steps", default_steps))
    launcher = hydra.get("launcher") or {}
    target = str(launcher.get("_target_", ""))
    kind = "slurm" if "slurm" in target.lower() else "local" if "local" in target.lower() else "unknown"
    folder = str(launcher.get("submitit_folder") or "${hydra.sweep.dir}/.submitit")
    folder = folder.replace("${hydra.sweep.dir}", str(sweep_dir))
    return Sweep(dir=sweep_dir, launcher=kind, submitit_folder=Path(folder),
                 runs=[specs[i] for i in sorted(specs)], has_manifest=False)


def _int(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
