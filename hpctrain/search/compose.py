"""A search worker's per-unit Hydra config, without a full compose per unit.

``ConfigLoader.load_sweep_config`` composes the whole config from its sources for every unit (about a third
of a second on a loaded node: the largest part of a worker's gap between units). A trial's overrides are the
sweep's fixed ones and ``key=value`` per searched key, and mostly set plain values: the config is composed
once per distinct set of config-group overrides, and each unit gets its value overrides applied by Hydra's
own function, ``hydra.overrides.task`` and ``hydra.job.override_dirname`` set as Hydra sets them (the same
config as a full compose: tests/test_search_compose.py compares them). Overrides of ``hydra.*`` keys take
the full compose.

The copy of the composed base is made once per base, not once per unit (a deep copy of the whole config,
its ``hydra`` node included, was most of what was left): when a unit's value overrides set the same keys,
in the same order, to plain values (no ``+key``, ``~key``, list or dict) as the previous unit's on that copy,
they are applied to the copy in place: those whose value changed (a new trial's, a PBT unit's new values);
an unchanged one is there already, since nothing else writes the task's part of the copy (Hydra's
``run_job`` hands the task a copy of its own). So no earlier unit's value is left, and the fields a unit's
run writes into the ``hydra`` node (its output dir, sweep subdir, job num and id, read-only flag) are put
back as the base has them first. A config with Hydra callbacks (which are handed
the config and may change anything in it) gets a fresh copy every unit. The config returned is valid until
the next call.
"""

import copy
from typing import Any, Callable, Dict, List, Optional, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hpctrain._compat.hydra import apply_overrides, get_overrides_dirname, group_checker
from hpctrain._compat.omegaconf import node_flag

# the hydra node's fields that a unit's run sets (the worker, Hydra's run_job): put back before reuse
PER_UNIT = ("runtime.output_dir", "sweep.subdir", "job.num", "job.id")
PLAIN = (str, int, float, bool, type(None))


def reusable(parsed: List[Override]) -> Optional[Tuple[str, ...]]:
    """The keys of value overrides that may be applied again in place over an earlier application of the
    same keys (each one set to a plain value); None when some override may not (it adds, deletes, merges)."""
    for o in parsed:
        if o.type not in (OverrideType.CHANGE, OverrideType.FORCE_ADD) or o.value_type is not ValueType.ELEMENT \
                or o.package is not None or not isinstance(o.value(), PLAIN):
            return None
    return tuple(o.key_or_group for o in parsed)


class Composer:
    def __init__(self, loader: Any, master: DictConfig) -> None:
        self.loader, self.master = loader, master
        self.parser = OverridesParser.create()
        self.group_exists: Callable[[str], bool] = group_checker(loader)
        self.groups: Dict[str, bool] = {}  # name -> whether it is a config group (the search path does not change)
        self.bases: Dict[Tuple[str, ...], DictConfig] = {}
        self.per_unit: Dict[Tuple[str, ...], Dict[str, Any]] = {}  # per base: its PER_UNIT fields, unresolved
        self.readonly: Dict[Tuple[str, ...], Optional[bool]] = {}  # per base: its hydra node's own flag
        self.callbacks: Dict[Tuple[str, ...], bool] = {}  # per base: whether it has Hydra callbacks
        self.parsed: Dict[str, Override] = {}  # one parse (ANTLR) per distinct override string
        # per base: its working copy and the (key, override) pairs last applied to it; only a reusable one
        self.working: Dict[Tuple[str, ...], Tuple[Tuple[Tuple[str, str], ...], DictConfig]] = {}

    def full(self, overrides: List[str]) -> DictConfig:
        return self.loader.load_sweep_config(self.master, list(overrides))

    def is_group(self, name: str) -> bool:
        if name not in self.groups:
            self.groups[name] = self.group_exists(name)
        return self.groups[name]

    def parse(self, overrides: List[str]) -> List[Override]:
        missing = [o for o in dict.fromkeys(overrides) if o not in self.parsed]
        if missing:
            self.parsed.update(zip(missing, self.parser.parse_overrides(missing)))
        return [self.parsed[o] for o in overrides]

    def __call__(self, overrides: List[str]) -> DictConfig:
        parsed = self.parse(list(overrides))
        if any(o.key_or_group.startswith("hydra") for o in parsed):
            return self.full(overrides)
        group = [self.is_group(o.key_or_group.split("@")[0]) for o in parsed]
        key = tuple(str(o.input_line) for o, g in zip(parsed, group) if g)
        base = self.bases.get(key)
        if base is None:
            base = self.bases[key] = self.full(list(key))
            self.per_unit[key] = {n: _raw(base.hydra, n) for n in PER_UNIT}
            self.readonly[key] = node_flag(base.hydra, "readonly")
            self.callbacks[key] = bool(OmegaConf.select(base, "hydra.callbacks"))
        values = [o for o, g in zip(parsed, group) if not g]
        keys = None if self.callbacks[key] else reusable(values)
        working = self.working.pop(key, None)
        applied, cfg = working if working is not None else (None, None)
        if cfg is None or keys is None or applied is None or tuple(k for k, _ in applied) != keys:
            cfg = copy.deepcopy(base)
            apply_overrides(values, cfg)  # raises as the full compose does
        else:
            self._reset(cfg, self.per_unit[key], self.readonly[key])
            # the same key and value as the last unit's is there already (nothing else writes the task's
            # part: Hydra's run_job hands the task a copy)
            apply_overrides([o for o, (_, line) in zip(values, applied) if o.input_line != line], cfg)
        names = cfg.hydra.job.config.override_dirname
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in parsed]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=parsed, kv_sep=names.kv_sep, item_sep=names.item_sep, exclude_keys=names.exclude_keys)
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        if keys is not None:  # kept only after a whole application (a failed one raised above: dropped)
            self.working[key] = (tuple(zip(keys, (str(o.input_line) for o in values))), cfg)
        return cfg

    @staticmethod
    def _reset(cfg: DictConfig, fields: Dict[str, Any], readonly: Optional[bool]) -> None:
        """The fields of the hydra node that the last unit's run set, as the base has them."""
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            for name, value in fields.items():
                OmegaConf.update(cfg.hydra, name, value, merge=False)
        OmegaConf.set_readonly(cfg.hydra, readonly)


def _raw(node: DictConfig, name: str) -> Any:
    """``node``'s field ``name`` (dotted) as written: an interpolation unresolved, MISSING as ``???``."""
    parent, _, leaf = name.rpartition(".")
    container = OmegaConf.to_container(OmegaConf.select(node, parent) if parent else node, resolve=False)
    assert isinstance(container, dict)
    return container[leaf]
