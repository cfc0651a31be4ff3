"""What the runs ran on, as ``report`` and the API show it: each run's hardware (its latest attempt's, as
:mod:`hpctrain.job.hardware` recorded it), grouped, and the one-line warning when a ranking mixes GPU models
(or, with no GPU, CPU models): a ranking over mixed hardware compares more than configs.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpctrain.core.atomic import read_json
from hpctrain.core.paths import RunPaths
from hpctrain.slurm.parse import expand_nodelist

CPU_ONLY = "no GPU"


def hosts(run_dir: Any, hardware: Mapping[str, Any], world_size: Optional[int]) -> Dict[int, str]:
    """The node of each rank of the run's latest attempt: rank 0's from its record, each other rank's own file
    (written in the same Slurm job and restart; only ranks below the world size, so a smaller rerun's stale
    files are left out)."""
    out: Dict[int, str] = {}
    if hardware.get("node"):
        out[0] = str(hardware["node"])
    folder = RunPaths(run_dir).hardware if run_dir else None
    if folder is None or not folder.is_dir():
        return out
    for path in sorted(folder.glob("rank-*.json")):
        facts = read_json(path) or {}
        rank = facts.get("rank")
        if not isinstance(rank, int) or rank <= 0 or facts.get("key") != hardware.get("key"):
            continue
        if world_size is not None and rank >= world_size:
            continue
        out[rank] = str(facts.get("node") or facts.get("host") or "?")
    return dict(sorted(out.items()))


def nodes(hardware: Mapping[str, Any]) -> List[str]:
    """The attempt's nodes: its Slurm job's node list expanded, else the one node it ran on."""
    listed = expand_nodelist(str(hardware.get("nodelist") or ""))
    return listed or ([str(hardware["node"])] if hardware.get("node") else [])


def describe(hardware: Mapping[str, Any]) -> str:
    """One run's hardware in a few words: ``2x NVIDIA H200 (driver 550.54, CUDA 12.4, torch CUDA 12.1)``."""
    if hardware.get("gpu_model"):
        versions = [f"driver {hardware['driver']}" if hardware.get("driver") else "",
                    f"CUDA {hardware['cuda_driver']}" if hardware.get("cuda_driver") else "",
                    f"torch CUDA {hardware['cuda']}" if hardware.get("cuda") else ""]
        shown = ", ".join(v for v in versions if v)
        return f"{hardware.get('gpu_count') or 1}x {hardware['gpu_model']}" + (f" ({shown})" if shown else "")
    return f"CPU {hardware.get('cpu_model') or '(model unknown)'}, {CPU_ONLY}"


def groups(runs: Sequence[Any]) -> List[Tuple[str, List[Any]]]:
    """(description, runs) for each hardware the runs were recorded on, most runs first."""
    by: Dict[str, List[Any]] = {}
    for r in runs:
        if r.hardware:
            by.setdefault(describe(r.hardware), []).append(r)
    return sorted(by.items(), key=lambda kv: -len(kv[1]))


def lines(runs: Sequence[Any]) -> List[str]:
    """``report``'s lines: where the ranked runs ran, one line per hardware."""
    out = []
    for shown, members in groups(runs):
        names = sorted({n for r in members for n in nodes(r.hardware)})
        out.append(f"hardware: {len(members)} run(s) on {shown}; nodes {', '.join(names) or '?'}")
    return out


def mixed_warning(runs: Sequence[Any]) -> Optional[str]:
    """One line when the ranked runs trained on different GPU models (or, none having a GPU, CPU models);
    runs with no record yet are left out."""
    recorded = [r for r in runs if r.hardware]
    gpus = any(r.hardware.get("gpu_model") for r in recorded)
    by: Dict[str, List[int]] = {}
    for r in recorded:
        name = (r.hardware.get("gpu_model") or CPU_ONLY) if gpus else (r.hardware.get("cpu_model") or "unknown CPU")
        by.setdefault(str(name), []).append(r.idx)
    if len(by) < 2:
        return None
    shown = "; ".join(f"{name}: {', '.join(f'#{i}' for i in idx)}" for name, idx in by.items())
    return (f"the ranked runs trained on different {'GPU' if gpus else 'CPU'} models ({shown}): "
            "the ranking compares hardware as well as configs")
