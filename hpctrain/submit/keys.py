"""The command line's keys, checked once against the config they change, before Hydra composes anything.

Hydra answers a key the config does not have (``lrr=1e-3``) with its advice to add it (``+lrr=...``),
once per point of a sweep, and a value of the wrong type with 4-6 lines. Here the overrides are parsed
once, the config is composed once with its config-group choices alone (once more per other option of a
swept group), and each key is set in it to each of its distinct values (a range: its first two): one line
per bad key, with the closest real key (flattened config keys and group names) or the group's options.
A 1000-point sweep is checked in the time of one composition.
"""

import decimal
import itertools
import math
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from hydra.core.override_parser.types import ChoiceSweep, Glob, Override, RangeSweep
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf import nodes as omegaconf_nodes
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

# names people type for hpctrain's keys: suggested where edit distance finds nothing
ALIASES = {"learning_rate": "lr", "lr_rate": "lr", "batchsize": "batch_size", "bs": "batch_size",
           "steps": "max_steps", "num_steps": "max_steps", "max_iters": "max_steps", "iterations": "max_steps",
           "epochs": "max_steps", "accumulate_grad_batches": "grad_accum", "gradient_accumulation": "grad_accum",
           "weight_decay": "optim.weight_decay", "warmup": "warmup_steps", "dtype": "precision",
           "amp": "precision", "clip_grad": "grad_clip", "random_seed": "seed"}
SCHEMA_SUFFIX = "_schema"  # hpctrain.schema's ConfigStore entries: chosen by the YAML files, never by users
_TYPES = {omegaconf_nodes.IntegerNode: "an integer", omegaconf_nodes.FloatNode: "a number",
          omegaconf_nodes.BooleanNode: "true or false", omegaconf_nodes.StringNode: "a string"}


def reach(name: str) -> int:
    """How many edits a typo of ``name`` may be: 1 up to 4 letters, 2 up to 8, else 3 (``typo`` is not
    ``precision``)."""
    return 1 if len(name) <= 4 else 2 if len(name) <= 8 else 3


def distance(a: str, b: str) -> int:
    """Edits from ``a`` to ``b``: insert, delete, replace, swap two neighbours (optimal string alignment)."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def closest(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The key ``name`` was most likely meant to be: a key beside it a typo away (``model.hiden``:
    ``model.hidden``), the same name elsewhere (``hidden``: ``model.hidden``), the whole dotted key a typo
    away; a top-level name is also matched against known aliases (``lerning_rate``: ``lr``). None when
    nothing is that close. Hydra's own keys are suggested only for ``hydra...`` names, and the other way round."""
    hydra = name.startswith("hydra")
    pool = [(c, c) for c in candidates if c != name and c.startswith("hydra") == hydra]
    parent, _, leaf = name.rpartition(".")
    if not parent and not hydra:
        pool += list(ALIASES.items())
    scored: List[Tuple[int, int, str]] = []
    for rank, (cand, meant) in enumerate(pool):
        c_parent, _, c_leaf = cand.rpartition(".")
        if c_parent == parent and (d := distance(leaf, c_leaf)) <= reach(leaf):
            scored.append((0, d, meant))
        elif c_leaf == leaf:
            scored.append((1, rank, meant))
        elif (d := distance(name, cand)) <= reach(name):
            scored.append((2, d, meant))
    return min(scored)[2] if scored else None


def flat_keys(cfg: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a config, nested ones too (``model``, ``model.hidden``), none resolved."""
    if isinstance(cfg, DictConfig):
        for key in cfg.keys():
            path = f"{prefix}{key!s}"
            yield path
            node = cfg._get_node(key)
            if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
                yield from flat_keys(node, f"{path}.")


class Checker:
    """The overrides of one command line against the config(s) Hydra would compose for it.

    ``compose(group_lines)``: the composed config (hydra node included) for those config-group overrides;
    ``options(group)``: a config group's options, None when ``group`` is not one; ``unread(key, n)``: a
    line when the app reads no top-level ``key`` that a sweep gives ``n`` values (0: an interval), else None.
    """

    def __init__(self, compose: Any, options: Any, groups: Sequence[str], unread: Any = None,
                 params: Any = None) -> None:
        self.compose, self.options, self.groups, self.unread = compose, options, list(groups), unread
        self.params = params  # parses a sweep file's ``hydra.sweeper.params`` lines, None: not read

    def problems(self, overrides: Sequence[Any]) -> List[str]:
        """One line per bad key (the first of its bad values), in command-line order; [] when the configs do
        not compose (Hydra then says why)."""
        out: Dict[str, str] = {}
        groups = [o for o in overrides if self.options(_group_of(o)) is not None]
        base: List[str] = []  # Hydra's own first composition: the group choices not swept
        points: List[str] = []  # a swept group's options, each composed on top of it
        for o in groups:
            good = [_line(o, v) for v in self._group_problem(o, out)]
            (points if o.is_sweep_override() else base).extend(good)
        try:
            configs = [self.compose(base)] + [self.compose(base + [line]) for line in points]
        except Exception:  # noqa: BLE001 - a config that does not compose: Hydra's own error says why
            return list(out.values())
        keys = [k for cfg in configs for k in flat_keys(cfg)] + self.groups
        in_file = self._sweep_file(configs[0], overrides)
        for o in list(overrides) + in_file:
            if o in groups or o.key_or_group in out:
                continue
            problem = self._value_problem(o, configs, [""] + points, keys, swept=o.is_sweep_override() or o in in_file)
            if problem:
                out[o.key_or_group] = problem
        return list(out.values())

    def _sweep_file(self, cfg: DictConfig, overrides: Sequence[Any]) -> List[Any]:
        """The sweeper's ``params`` (a sweep file's keys, ``+sweep=NAME``) the command line does not set."""
        params = OmegaConf.select(cfg, "hydra.sweeper.params", throw_on_missing=False)
        if self.params is None or not isinstance(params, DictConfig):
            return []
        given = {o.key_or_group for o in overrides}
        raw = OmegaConf.to_container(params, resolve=False)
        assert isinstance(raw, dict)
        try:
            parsed = self.params([f"{k!s}={v}" for k, v in raw.items() if str(k) not in given])
        except Exception:  # noqa: BLE001 - the sweeper's own parse says what is wrong
            return []
        return [o for o in parsed if self.options(_group_of(o)) is None]  # a group swept in the file: Hydra's

    def _group_problem(self, o: Any, out: Dict[str, str]) -> List[str]:
        """The group override's good values (each an option of the group); a line in ``out`` for a bad one."""
        group = _group_of(o)
        if o.is_delete() or isinstance(o.value(), Glob):
            return []
        values = [str(v) for v in _values(o)]
        shown = sorted(x for x in self.options(group) if not x.endswith(SCHEMA_SUFFIX))
        bad = [v for v in values if v not in shown]
        if bad:
            near = closest(bad[0], shown)
            hint = f"; did you mean {near}?" if near else ""
            out[o.key_or_group] = (f"{o.get_key_element()}={bad[0]}: no such option of the config group {group!r}"
                                   f"{hint} (options: {', '.join(shown) or 'none'})")
        return [v for v in values if v not in bad]

    def _value_problem(self, o: Any, configs: List[DictConfig], labels: List[str], keys: List[str],
                       swept: bool) -> Optional[str]:
        """The one line for a value override, else None: a swept one (or one of a sweep file) must fit some
        point's config (the launcher checks each point), one not swept every config: Hydra's first composition,
        ``configs[0]``, and each swept group option's (``labels``: the group choice each was composed with)."""
        key = o.key_or_group
        if self.unread is not None and o.is_add() and o.is_sweep_override() and "." not in key:
            unread = self.unread(key, _count(o))
            if unread:
                return f"{o.get_key_element()}: {unread}"  # a +key no run reads: nothing to compare
        values = _values(o) if o.is_sweep_override() and o.is_discrete_sweep() else [o.value()]
        if o.is_sweep_override() and not o.is_discrete_sweep():
            values = [_UNCHECKED]  # an interval (a search): the key alone is checked
        values = values or [_UNCHECKED]  # an empty range: the key alone
        found = [_set_problem(o, cfg, values, keys) for cfg in configs]  # (each config gets the value set)
        if swept:
            return None if None in found else found[0]
        fits = [label for label, problem in zip(labels, found) if problem is None and label]
        misfits = [label for label, problem in zip(labels, found) if problem is not None and label]
        if found[0] is None and misfits:
            return (f"{o.get_key_element()}: does not fit the points with {misfits[0]}; a key that is not swept "
                    f"must fit every point")
        if found[0] is not None and fits:
            return (f"{o.get_key_element()}: fits only the points with {fits[0]}; a key that is not swept must "
                    f"fit every point")
        return found[0]


_UNCHECKED: Any = object()


def _set_problem(o: Any, cfg: DictConfig, values: Sequence[Any], keys: List[str]) -> Optional[str]:
    key = o.key_or_group
    shown = o.get_key_element()
    node = _node(cfg, key)
    exists = node is not None
    if o.is_delete():
        return None if exists else _unknown(shown, key, cfg, keys)
    if o.is_add() and node is not None and not node._is_none() and not any(isinstance(v, (dict, list)) for v in values):
        return f"{shown}: {key} is in the config already; set it without the +: {key}=..."
    for value in values:
        try:
            with read_write(cfg):
                if value is _UNCHECKED:
                    if not exists and not _addable(cfg, key) and not (o.is_add() or o.is_force_add()):
                        return _unknown(shown, key, cfg, keys)
                    continue
                OmegaConf.update(cfg, key, value, merge=True, force_add=o.is_add() or o.is_force_add())
        except (ConfigAttributeError, ConfigKeyError) as exc:
            missing = getattr(exc, "full_key", None) or key
            return _unknown(shown if missing == key else missing, str(missing), cfg, keys)
        except ValidationError as exc:
            return f"{shown}={_show(value)}: expected {_expected(cfg, key, exc)}"
        except OmegaConfBaseException as exc:
            return f"{shown}={_show(value)}: {str(getattr(exc, 'msg', None) or exc).splitlines()[0]}"
    return None


def _node(cfg: Any, key: str) -> Any:
    """The node at a dotted ``key`` (a value unresolved), None where there is none."""
    for part in key.split(".") if key else ():
        if not isinstance(cfg, DictConfig) or part not in cfg:
            return None
        cfg = cfg._get_node(part)
    return cfg


def _addable(cfg: DictConfig, key: str) -> bool:
    """Whether Hydra would add ``key`` without a ``+`` (its parent is a dict open to new keys)."""
    node = _node(cfg, key.rpartition(".")[0])
    return isinstance(node, DictConfig) and not OmegaConf.is_struct(node)


def _unknown(shown: str, key: str, cfg: DictConfig, keys: List[str]) -> str:
    near = closest(key, keys)
    if near:
        return f"{shown}: no such key in the config; did you mean {near}?"
    parent = key.rpartition(".")[0]
    node = _node(cfg, parent) if parent else None
    if isinstance(node, DictConfig) and len(node) <= 12:
        return f"{shown}: no such key in the config ({parent} has {', '.join(str(k) for k in node.keys())})"
    return f"{shown}: no such key in the config (`--cfg job` shows the config)"


def _expected(cfg: DictConfig, key: str, exc: ValidationError) -> str:
    node = _node(cfg, key)
    if isinstance(node, omegaconf_nodes.EnumNode):
        return "one of " + ", ".join(m.name for m in node.enum_type)
    what = next((name for kind, name in _TYPES.items() if isinstance(node, kind)), None)
    if what is None:
        return str(getattr(exc, "msg", None) or exc).splitlines()[0]
    optional = node is not None and node._is_optional()
    return what + ("" if optional else " (not null)") if "Optional" in str(exc) else what


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _group_of(o: Any) -> str:
    return str(o.key_or_group).split("@", 1)[0]


def _line(o: Any, value: str) -> str:
    return f"{o.get_key_element()}={value}"


def _values(o: Any) -> List[Any]:
    """A sweep override's distinct values (a range's first two: the rest have their types; a glob: unchecked);
    a plain one's."""
    if not o.is_sweep_override():
        return [o.value()]
    value = o.value()
    if isinstance(value, RangeSweep):
        start, stop, step = value.start, value.stop, value.step
        if start is None or stop is None:
            return []
        return [v for v in (start, start + step) if (v < stop if step > 0 else v > stop)]
    if isinstance(value, Glob):
        return [_UNCHECKED]  # expanded over a group's options, by Hydra's loader
    seen: Dict[str, Any] = {}
    for v in o.sweep_iterator():
        v = Override._convert_value(v)  # a quoted "1e-3" is the text 1e-3, as in the point's own override
        seen.setdefault(repr(v), v)
    return list(seen.values())


def _count(o: Any) -> int:
    return count_values(o, 1_000_000) if o.is_discrete_sweep() else 0


def count_values(o: Override, most: int) -> int:
    """How many values a sweep override lists (1 for a plain value), without listing a range; a list of
    values that is neither is counted up to ``most``."""
    if not o.is_sweep_override():
        return 1
    value = o.value()
    if isinstance(value, ChoiceSweep):
        return len(value.list)
    if isinstance(value, RangeSweep) and value.start is not None and value.stop is not None:
        if all(isinstance(v, int) for v in (value.start, value.stop, value.step)):
            return len(range(int(value.start), int(value.stop), int(value.step)))
        start, stop, step = (decimal.Decimal(v) for v in (value.start, value.stop, value.step))
        return max(0, math.ceil((stop - start) / step)) if step else 0
    if not o.is_discrete_sweep():
        return 1  # an interval: BasicSweeper refuses it with its own message
    return sum(1 for _ in itertools.islice(o.sweep_iterator(), most))


def command_line_problems(argv: Sequence[str], config_path: str, config_name: str, unread: Any = None,
                          before: Any = None) -> List[str]:
    """One line per bad key of an app's command line (``python -m hpctrain ...``), its sweep file's
    ``hydra.sweeper.params`` included; [] where Hydra's parser or composition refuses it (Hydra says why in
    one line) or for a flag that composes nothing (``--help``). ``before(overrides)``: a line that refuses
    the parsed overrides before anything is composed (a sweep too large to plan), else None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from hpctrain._compat.hydra import app_config_loader, hydra_args

    args = hydra_args(list(argv))
    if args is None or args.help or args.hydra_help or args.shell_completion:
        return []
    parser = OverridesParser.create()
    try:
        overrides = parser.parse_overrides(list(args.overrides))
    except Exception:  # noqa: BLE001 - Hydra's grammar error is one line already
        return []
    if not args.multirun and any(o.is_sweep_override() for o in overrides):
        return []  # Hydra's own: sweeping needs -m
    refused = before(overrides) if before is not None and args.multirun else None
    if refused:
        return [refused]
    loader = app_config_loader(args.config_path or config_path, args.config_dir)
    name = args.config_name or config_name
    searchpath = [o.input_line for o in overrides if o.key_or_group == "hydra.searchpath"]
    mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN

    def compose(lines: List[str]) -> DictConfig:
        return loader.load_configuration(name, searchpath + lines, mode, from_shell=True)

    def options(group: str) -> Optional[List[str]]:
        try:
            if group.startswith(("hydra.", "+", "~")) or not loader.repository.group_exists(group):
                return None
        except AttributeError:
            return None
        return list(loader.get_group_options(group, config_name=name, overrides=searchpath))

    try:
        groups = [g for g in loader.list_groups("") if g != "hydra"]
        groups += [f"hydra/{g}" for g in loader.list_groups("hydra")]
    except Exception:  # noqa: BLE001 - the names are only for suggestions
        groups = []
    checked = [o for o in overrides if o.key_or_group != "hydra.searchpath"]
    checker = Checker(compose, options, groups, unread, params=lambda text: parser.parse_overrides(text))
    try:
        return checker.problems(checked)
    except Exception:  # noqa: BLE001 - a check that cannot decide leaves the command line to Hydra
        return []


def swept_problems(loader: Any, config: DictConfig, job_overrides: Sequence[Sequence[str]]) -> List[str]:
    """One line per bad swept key of a sweep any app launches (its points' override strings), checked once
    against ``config`` (Hydra's composed config: what the points share, applied already); [] when none is bad.
    The launcher asks only when its plan found bad points: a good sweep pays nothing."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpctrain._compat.hydra import group_checker

    values: Dict[str, List[str]] = {}
    for point in job_overrides:
        for line in point:
            key, _, value = line.partition("=")
            if value not in values.setdefault(key, []):
                values[key].append(value)
    swept = [f"{key}={','.join(vs)}" for key, vs in values.items() if len(vs) > 1]  # the rest: applied already
    if not swept:
        return []
    try:
        overrides = OverridesParser.create().parse_overrides(swept)
    except Exception:  # noqa: BLE001 - the plan's own lines say it
        return []
    is_group = group_checker(loader)

    def options(group: str) -> Optional[List[str]]:
        return list(loader.get_group_options(group)) if not group.startswith("hydra.") and is_group(group) else None

    checker = Checker(lambda lines: loader.load_sweep_config(config, lines), options, [])
    try:
        return checker.problems(overrides)
    except Exception:  # noqa: BLE001 - the plan's own lines say it
        return []
