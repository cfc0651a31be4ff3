"""A search worker's per-unit Hydra config, without a full compose per unit.

``ConfigLoader.load_sweep_config`` composes the whole config from its sources for every unit (about a third
of a second on a loaded node: the largest part of a worker's gap between units). A trial's overrides are the
sweep's fixed ones and ``key=value`` per searched key, and mostly set plain values: the config is composed
once per distinct set of config-group overrides, and each unit gets a copy with its value overrides applied
by Hydra's own function, ``hydra.overrides.task`` and ``hydra.job.override_dirname`` set as Hydra sets
them (the same config as a full compose: tests/test_search_compose.py compares them). Overrides of
``hydra.*`` keys take the full compose.
"""

import copy
from typing import Any, Callable, Dict, List, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from hpctrain._compat.hydra import apply_overrides, get_overrides_dirname, group_checker


class Composer:
    def __init__(self, loader: Any, master: DictConfig) -> None:
        self.loader, self.master = loader, master
        self.parser = OverridesParser.create()
        self.is_group: Callable[[str], bool] = group_checker(loader)
        self.bases: Dict[Tuple[str, ...], DictConfig] = {}

    def full(self, overrides: List[str]) -> DictConfig:
        return self.loader.load_sweep_config(self.master, list(overrides))

    def __call__(self, overrides: List[str]) -> DictConfig:
        parsed = self.parser.parse_overrides(list(overrides))
        if any(o.key_or_group.startswith("hydra") for o in parsed):
            return self.full(overrides)
        group = [self.is_group(o.key_or_group.split("@")[0]) for o in parsed]
        key = tuple(o.input_line for o, g in zip(parsed, group) if g)
        base = self.bases.get(key)
        if base is None:
            base = self.bases[key] = self.full(list(key))
        cfg = copy.deepcopy(base)
        apply_overrides([o for o, g in zip(parsed, group) if not g], cfg)
        names = cfg.hydra.job.config.override_dirname
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in parsed]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=parsed, kv_sep=names.kv_sep, item_sep=names.item_sep, exclude_keys=names.exclude_keys)
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        return cfg
