"""Turn a sweep's override lists into runs: their configs, directories and names, fast.

Hydra's own launchers compose every point from scratch (tens of ms each: 40+ s for 1000 points).
Here a point's config-group choices (``model=cnn``) are composed by Hydra once per distinct set, and
the plain value overrides (``lr=1e-3``) are applied to a copy with Hydra's own override machinery,
so the type checks of the structured configs still apply. The job on the compute node composes its
config again with Hydra in full; this plan only validates and names runs.
"""

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from hpctrain.compat import apply_overrides, get_overrides_dirname


@dataclass
class Run:
    idx: int
    overrides: List[str]
    run_dir: Path
    cfg: DictConfig  # the app's config for this point (no hydra node): what the task function gets

    @property
    def name(self) -> str:
        return self.run_dir.name


@dataclass
class _Base:
    """One composed config per distinct set of config-group choices, split for cheap per-point copies."""

    task: DictConfig
    subdir: Any  # hydra.sweep.subdir, unresolved
    sweep_dir: str
    job_name: str
    dirname: Dict[str, Any]  # hydra.job.config.override_dirname


def plan_runs(ctx: HydraContext, config: DictConfig, job_overrides: Sequence[Sequence[str]],
              first_idx: int) -> Tuple[List[Run], List[str]]:
    """The runs of the good points, and one line per bad point (all of them, not just the first)."""
    loader = ctx.config_loader
    parser = OverridesParser.create()
    repo = getattr(loader, "repository", None)
    bases: Dict[Tuple[str, ...], _Base] = {}
    runs: List[Run] = []
    errors: List[str] = []
    for offset, overrides in enumerate(job_overrides):
        idx = first_idx + offset
        try:
            parsed = parser.parse_overrides(list(overrides))
            if any(o.key_or_group.startswith("hydra") for o in parsed):
                run = _full_compose(loader, config, parsed, idx, list(overrides))  # rare: Hydra itself swept
            else:
                is_group = [repo is not None and repo.group_exists(o.key_or_group.split("@")[0]) for o in parsed]
                groups = tuple(o.input_line for o, g in zip(parsed, is_group) if g)
                if groups not in bases:
                    bases[groups] = _split(loader.load_sweep_config(config, list(groups)))
                base = bases[groups]
                cfg = copy.deepcopy(base.task)
                apply_overrides([o for o, g in zip(parsed, is_group) if not g], cfg)
                run_dir = _run_dir(base, parsed, idx)
                run = Run(idx=idx, overrides=list(overrides), run_dir=run_dir, cfg=cfg)
        except Exception as exc:  # noqa: BLE001 - every bad point is reported, not just the first
            errors.append(f"run {idx} ({' '.join(overrides)}): {_one_line(exc)}")
            continue
        runs.append(run)
    return runs, errors


def _split(full: DictConfig) -> _Base:
    task = copy.deepcopy(full)
    with open_dict(task):
        del task["hydra"]
    return _Base(
        task=task,
        subdir=OmegaConf.to_container(full.hydra.sweep, resolve=False)["subdir"],
        sweep_dir=str(full.hydra.sweep.dir),
        job_name=str(full.hydra.job.name),
        dirname=OmegaConf.to_container(full.hydra.job.config.override_dirname, resolve=True),
    )


def _run_dir(base: _Base, parsed: List[Any], idx: int) -> Path:
    """Resolve hydra.sweep.subdir for one point from the few values it may use (as run_job would)."""
    dirname = get_overrides_dirname(overrides=parsed, kv_sep=base.dirname["kv_sep"],
                                    item_sep=base.dirname["item_sep"], exclude_keys=base.dirname["exclude_keys"])
    naming = OmegaConf.create({"hydra": {
        "job": {"num": idx, "id": f"plan_{idx}", "name": base.job_name, "override_dirname": dirname},
        "sweep": {"dir": base.sweep_dir, "subdir": base.subdir},
    }})
    return Path(base.sweep_dir) / str(naming.hydra.sweep.subdir)


def _full_compose(loader: Any, config: DictConfig, parsed: List[Any], idx: int, overrides: List[str]) -> Run:
    cfg = loader.load_sweep_config(config, overrides)
    job = cfg.hydra.job
    with open_dict(job):
        job.num, job.id = idx, f"plan_{idx}"
        job.override_dirname = get_overrides_dirname(
            overrides=parsed, kv_sep=job.config.override_dirname.kv_sep,
            item_sep=job.config.override_dirname.item_sep,
            exclude_keys=list(job.config.override_dirname.exclude_keys))
    run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
    base = _split(cfg)
    return Run(idx=idx, overrides=overrides, run_dir=run_dir, cfg=base.task)


def exclude_constant_keys(config: DictConfig, job_overrides: Sequence[Sequence[str]]) -> None:
    """Name run dirs by what varies: a key with the same value in every point is left out of the names.

    Added as a Hydra override of ``override_dirname.exclude_keys``, so that the job on the compute node,
    which composes its config again from the sweep's Hydra overrides, names the same directory.
    """
    if len(job_overrides) < 2:
        return
    parser = OverridesParser.create()
    values: Dict[str, List[str]] = {}
    for overrides in job_overrides:
        for o in parser.parse_overrides(list(overrides)):
            values.setdefault(o.key_or_group, []).append(o.input_line)
    # constant: set in every point, always to the same value
    constant = [k for k, v in values.items() if len(v) == len(job_overrides) and len(set(v)) == 1]
    if not constant:
        return
    dirname = config.hydra.job.config.override_dirname
    keys = list(dict.fromkeys(list(dirname.exclude_keys) + constant))
    quoted = ",".join(f"'{k}'" for k in keys)
    with open_dict(config):
        dirname.exclude_keys = keys
        config.hydra.overrides.hydra.append(f"hydra.job.config.override_dirname.exclude_keys=[{quoted}]")


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    if exc.__cause__ is not None:  # Hydra's "Error merging override x=y" holds the reason in its cause
        text += f": {exc.__cause__}"
    text = " ".join(text.split())
    return text if len(text) < 400 else text[:397] + "..."
