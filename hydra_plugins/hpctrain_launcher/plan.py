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
from typing import Dict, List, Sequence, Tuple

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict


@dataclass
class Run:
    idx: int
    overrides: List[str]
    run_dir: Path
    cfg: DictConfig  # the whole config (hydra node included)

    @property
    def name(self) -> str:
        return self.run_dir.name


class PlanError(Exception):
    """Raised with one line per bad sweep point."""


def plan_runs(ctx: HydraContext, config: DictConfig, job_overrides: Sequence[Sequence[str]], first_idx: int) -> List[Run]:
    loader = ctx.config_loader
    parser = OverridesParser.create()
    repo = getattr(loader, "repository", None)
    bases: Dict[Tuple[str, ...], DictConfig] = {}
    runs: List[Run] = []
    errors: List[str] = []
    for offset, overrides in enumerate(job_overrides):
        idx = first_idx + offset
        try:
            parsed = parser.parse_overrides(list(overrides))
            is_group = [repo is not None and repo.group_exists(o.key_or_group.split("@")[0]) for o in parsed]
            groups = tuple(o.input_line for o, g in zip(parsed, is_group) if g)
            if groups not in bases:
                bases[groups] = loader.load_sweep_config(config, list(groups))
            cfg = copy.deepcopy(bases[groups])
            ConfigLoaderImpl._apply_overrides_to_config([o for o, g in zip(parsed, is_group) if not g], cfg)
            job = cfg.hydra.job
            with open_dict(job):
                job.num = idx
                job.id = f"plan_{idx}"
                job.override_dirname = get_overrides_dirname(
                    overrides=parsed,
                    kv_sep=job.config.override_dirname.kv_sep,
                    item_sep=job.config.override_dirname.item_sep,
                    exclude_keys=list(job.config.override_dirname.exclude_keys),
                )
            run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        except Exception as exc:  # noqa: BLE001 - every bad point is reported, not just the first
            errors.append(f"run {idx} ({' '.join(overrides)}): {_one_line(exc)}")
            continue
        runs.append(Run(idx=idx, overrides=list(overrides), run_dir=run_dir, cfg=cfg))
    if errors:
        raise PlanError("\n".join(errors))
    return runs


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


def task_config(run: Run) -> DictConfig:
    """The app's part of the config (what the task function receives)."""
    cfg = copy.copy(run.cfg)
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) < 400 else text[:397] + "..."


